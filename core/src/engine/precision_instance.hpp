// The host's view of a precision plugin instance (torch tier).
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>

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

 private:
  static hasten_optimizer* h(torch::optim::Optimizer& o) {
    return reinterpret_cast<hasten_optimizer*>(&o);
  }
};

}  // namespace hasten::detail
