// LibTorch's current stream for a device buffer, for the comm plugins: a collective on a CUDA
// buffer must run after the kernels that LibTorch queued on the calling thread's current
// stream (the gradient a backward kernel is still writing), as c10d's NCCL backend orders its
// work. Kept apart so that the communicator itself needs no LibTorch header.
#pragma once

#include <dlpack/dlpack.h>

namespace hasten::detail {

// The calling thread's current stream on the buffer's CUDA device as a cudaStream_t, or NULL
// when there is none to name: CPU buffers, a LibTorch without CUDA, or a LibTorch older than
// 2.2, whose c10::Stream has no native handle (the plugin then orders after the legacy default
// stream, which is LibTorch's current stream unless the user changed it).
void* current_stream(const DLDevice& device) noexcept;

}  // namespace hasten::detail
