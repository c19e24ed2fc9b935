// LibTorch's current stream for a device buffer, for the comm plugins: a collective on a CUDA
// buffer must run after the kernels that LibTorch queued on the calling thread's current
// stream (the gradient a backward kernel is still writing), as c10d's NCCL backend orders its
// work, and a stream-ordered wait (plugin.h, ABI 1.6) makes that stream wait for it. Kept
// apart, and free of CUDA headers (it goes through c10's DeviceGuardImplInterface), so that
// neither the communicator nor libhasten needs a CUDA header.
#pragma once

#include <dlpack/dlpack.h>

namespace at {
class Tensor;
}  // namespace at

namespace hasten::detail {

// The calling thread's current stream on the buffer's CUDA device as a cudaStream_t, or NULL
// when that is LibTorch's default stream (the legacy default stream, whose handle is NULL) or
// there is none to name: CPU buffers, or a LibTorch built without CUDA (a plugin then orders
// after the legacy default stream). LibTorch 2.11-2.15: c10::Stream::native_handle().
void* current_stream(const DLDevice& device) noexcept;

// The same, telling the default stream from none: true with *stream set (NULL for the legacy
// default stream) when LibTorch has a current stream for the device, false otherwise.
bool find_current_stream(const DLDevice& device, void** stream) noexcept;

// Tells LibTorch's caching allocator that t's memory is in use by the calling thread's
// current stream on t's device, so that once t is freed the memory is reused only after the
// work queued on that stream so far (c10::cuda::CUDACachingAllocator::recordStream through
// c10's DeviceGuardImplInterface). After a stream-ordered wait on that stream, this makes
// freeing t safe whichever stream allocated it. Does nothing for a tensor not on a CUDA
// device, or not from the caching allocator.
void record_on_current_stream(const at::Tensor& t) noexcept;

}  // namespace hasten::detail
