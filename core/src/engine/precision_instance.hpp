// The host's view of a precision plugin instance (torch tier).
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <optional>
#include <string>

#include "plugins/plugin_instances.hpp"

namespace hasten::detail {

class PrecisionInstance : public PluginInstance {
 public:
  using PluginInstance::PluginInstance;

  void check_device(const DLDevice& device) {
    if (auto fn = vt().precision.check_device) call("check_device", [&] { return fn(instance_, device); });
  }
  bool has_autocast() const { return vt().precision.autocast_enter != nullptr; }
  void* autocast_enter(const DLDevice& device) {
    void* token = nullptr;
    if (auto fn = vt().precision.autocast_enter)
      call("autocast_enter", [&] { return fn(instance_, device, &token); });
    return token;
  }
  void autocast_exit(void* token) {
    if (auto fn = vt().precision.autocast_exit) call("autocast_exit", [&] { return fn(instance_, token); });
  }
  void scale_loss(torch::Tensor& loss) {
    if (auto fn = vt().precision.scale_loss)
      call("scale_loss", [&] { return fn(instance_, reinterpret_cast<hasten_tensor*>(&loss)); });
  }
  void unscale_gradients(torch::optim::Optimizer& optimizer) {
    if (auto fn = vt().precision.unscale_gradients)
      call("unscale_gradients", [&] { return fn(instance_, h(optimizer)); });
  }
  bool before_step(torch::optim::Optimizer& optimizer) {
    int32_t skip = 0;
    if (auto fn = vt().precision.before_step)
      call("before_step", [&] { return fn(instance_, h(optimizer), &skip); });
    return skip != 0;
  }
  void after_step(torch::optim::Optimizer& optimizer, bool skipped) {
    if (auto fn = vt().precision.after_step)
      call("after_step", [&] { return fn(instance_, h(optimizer), skipped ? 1 : 0); });
  }
  double loss_scale() {
    double scale = 1.0;
    if (auto fn = vt().precision.loss_scale) call("loss_scale", [&] { return fn(instance_, &scale); });
    return scale;
  }
  // ABI 1.7: the state a checkpoint keeps (a JSON object's text); nullopt for a precision
  // without state (or of an older minor, whose copied vtable has the slot NULL).
  std::optional<std::string> state_dict() {
    auto fn = vt().precision.state_dict;
    if (fn == nullptr) return std::nullopt;
    size_t size = 0;
    call("state_dict", [&] { return fn(instance_, nullptr, 0, &size); });
    std::string text(size, '\0');
    call("state_dict", [&] { return fn(instance_, text.data(), text.size(), &size); });
    text.resize(size == 0 ? 0 : size - 1);
    return text;
  }
  bool has_state() const { return vt().precision.state_dict != nullptr && vt().precision.load_state_dict != nullptr; }
  void load_state_dict(const std::string& json) {
    if (auto fn = vt().precision.load_state_dict) call("load_state_dict", [&] { return fn(instance_, json.c_str()); });
  }

 private:
  static hasten_optimizer* h(torch::optim::Optimizer& o) {
    return reinterpret_cast<hasten_optimizer*>(&o);
  }
};

}  // namespace hasten::detail
