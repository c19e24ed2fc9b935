// LibTorch's current stream for a device buffer (current_stream.hpp).
#include "current_stream.hpp"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/version.h>

namespace hasten::detail {

void* current_stream(const DLDevice& device) noexcept {
  if (device.device_type != kDLCUDA) return nullptr;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
  if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) return nullptr;
  try {
    const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    const c10::Stream stream =
        impl->getStream(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device.device_id)));
    return stream.native_handle();
  } catch (...) {
    return nullptr;
  }
#else
  return nullptr;
#endif
}

}  // namespace hasten::detail
