// LibTorch's current stream for a device buffer (current_stream.hpp), through c10's
// device-generic interface, so that libhasten needs no CUDA headers; the raw handle comes from
// torch_compat.hpp (c10::Stream::native_handle, LibTorch 2.11 on).
#include "comm/current_stream.hpp"

#include <hasten/torch_compat.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace hasten::detail {

bool find_current_stream(const DLDevice& device, void** stream) noexcept {
  if (device.device_type != kDLCUDA) return false;
  if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) return false;
  try {
    const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    const c10::Stream current =
        impl->getStream(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device.device_id)));
    *stream = compat::native_stream_handle(current);  // NULL for the default stream
    return true;
  } catch (...) {
    return false;
  }
}

void* current_stream(const DLDevice& device) noexcept {
  void* stream = nullptr;
  return find_current_stream(device, &stream) ? stream : nullptr;
}

void record_on_current_stream(const at::Tensor& t) noexcept {
  try {
    if (!t.defined() || !t.is_cuda() || !t.has_storage()) return;
    if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) return;
    const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    const c10::Stream stream = impl->getStream(t.device());
    impl->recordDataPtrOnStream(t.storage().data_ptr(), stream);
  } catch (...) {  // a storage from another allocator, a broken context: nothing to record
  }
}

}  // namespace hasten::detail
