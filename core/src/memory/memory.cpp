// The non-template half of hasten/memory.hpp: recognising an out-of-memory error and emptying
// the device caches.
#include <hasten/logging.hpp>
#include <hasten/memory.hpp>

#include <ATen/DeviceAccelerator.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>

#include <new>

namespace hasten::detail {

bool is_out_of_memory(const std::exception& e) noexcept {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr || dynamic_cast<const std::bad_alloc*>(&e) != nullptr)
    return true;
  // The messages Accelerate's should_reduce_batch_size matches, and LibTorch's CPU allocator's
  // own: an error hasten wrapped (a plugin's, the engine's) keeps its cause's text.
  const std::string what = e.what();
  for (const char* text : {"CUDA out of memory.", "out of memory", "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
                           "DefaultCPUAllocator: can't allocate memory", "DefaultCPUAllocator: not enough memory"})
    if (what.find(text) != std::string::npos) return true;
  return false;
}

void empty_device_caches() {
  if (torch::cuda::is_available()) at::accelerator::emptyCache();
}

void log_batch_size_retry(int64_t failed, int64_t next, const std::exception& e) {
  std::string line = e.what();
  if (const auto nl = line.find('\n'); nl != std::string::npos) line.resize(nl);
  if (next > 0)
    get_logger("hasten", false)
        ->warn("find_executable_batch_size: batch size {} ran out of memory ({}); trying {}", failed, line, next);
  else
    get_logger("hasten", false)->warn("find_executable_batch_size: batch size 1 ran out of memory ({})", line);
}

}  // namespace hasten::detail
