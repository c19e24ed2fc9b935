// Entering and leaving LibTorch's autocast the way torch.autocast does: remember the previous
// state, set the dtype, count nesting, clear the cast cache when the outermost region ends.
// States live on a thread-local stack (autocast state is thread-local), so regions nest and
// no forward allocates.
#pragma once

#include <hasten/plugin_torch.hpp>
#include <hasten/torch_compat.hpp>

#include <vector>

namespace hasten::precision {

class AutocastStack {
 public:
  // Enters autocast to `dtype` on the device's type.
  static void enter(const DLDevice& device, at::ScalarType dtype) {
    const auto type = device.device_type == kDLCUDA ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
    stack().push_back({type, compat::autocast_enabled(type), compat::autocast_dtype(type), true});
    compat::set_autocast_enabled(type, true);
    compat::set_autocast_dtype(type, dtype);
    at::autocast::increment_nesting();
  }
  // A region that changes nothing (kept so enter/exit stay paired).
  static void enter_noop() { stack().push_back({c10::DeviceType::CPU, false, at::kFloat, false}); }
  static void exit() {
    auto& s = stack();
    if (s.empty()) throw sdk::Error(HASTEN_ERR_INVALID_USAGE, "autocast_exit without autocast_enter");
    const Saved saved = s.back();
    s.pop_back();
    if (!saved.changed) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    compat::set_autocast_enabled(saved.type, saved.enabled);
    compat::set_autocast_dtype(saved.type, saved.dtype);
  }

 private:
  struct Saved {
    c10::DeviceType type;
    bool enabled;
    at::ScalarType dtype;
    bool changed;
  };
  static std::vector<Saved>& stack() {
    thread_local std::vector<Saved> s;
    return s;
  }
};

}  // namespace hasten::precision
