// The host's view of a strategy plugin instance (torch tier).
#pragma once

#include <exception>
#include <functional>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <string>
#include <utility>
#include <vector>

#include "plugins/plugin_instances.hpp"

namespace hasten::detail {

class StrategyInstance : public PluginInstance {
 public:
  using PluginInstance::PluginInstance;

  void prepare_model(torch::nn::Module& model, const hasten_model_info& info) {
    call("prepare_model", [&] { return vt().strategy.prepare_model(instance_, h(model), &info); });
  }
  void prepare_optimizer(torch::optim::Optimizer& optimizer) {
    if (auto fn = vt().strategy.prepare_optimizer)
      call("prepare_optimizer", [&] { return fn(instance_, h(optimizer)); });
  }
  void set_gradient_sync(torch::nn::Module& model, bool enabled) {
    if (auto fn = vt().strategy.set_gradient_sync)
      call("set_gradient_sync", [&] { return fn(instance_, h(model), enabled ? 1 : 0); });
  }
  void before_backward() {
    if (auto fn = vt().strategy.before_backward) call("before_backward", [&] { return fn(instance_); });
  }
  void after_backward() {
    if (auto fn = vt().strategy.after_backward) call("after_backward", [&] { return fn(instance_); });
  }
  void before_optimizer_step(torch::optim::Optimizer& optimizer) {
    if (auto fn = vt().strategy.before_optimizer_step)
      call("before_optimizer_step", [&] { return fn(instance_, h(optimizer)); });
  }
  void after_optimizer_step(torch::optim::Optimizer& optimizer) {
    if (auto fn = vt().strategy.after_optimizer_step)
      call("after_optimizer_step", [&] { return fn(instance_, h(optimizer)); });
  }
  bool has_unit_events() const { return vt().strategy.unit_pre_forward != nullptr; }
  bool has_unit_built() const { return vt().strategy.unit_built != nullptr; }
  void unit_built(torch::nn::Module& unit, const hasten_model_info& info) {
    call("unit_built", [&] { return vt().strategy.unit_built(instance_, h(unit), &info); });
  }
  void unit_pre_forward(torch::nn::Module& model, uint32_t unit) {
    if (auto fn = vt().strategy.unit_pre_forward) call("unit_pre_forward", [&] { return fn(instance_, h(model), unit); });
  }
  void unit_post_forward(torch::nn::Module& model, uint32_t unit, std::vector<torch::Tensor>& outputs) {
    if (auto fn = vt().strategy.unit_post_forward) {
      std::vector<hasten_tensor*> handles;
      handles.reserve(outputs.size());
      for (auto& t : outputs) handles.push_back(reinterpret_cast<hasten_tensor*>(&t));
      call("unit_post_forward", [&] {
        return fn(instance_, h(model), unit, handles.data(), static_cast<uint32_t>(handles.size()));
      });
    }
  }
  bool has_memory_report() const { return vt().strategy.memory_report != nullptr; }
  hasten_memory_report memory_report() {
    hasten_memory_report r{};
    r.struct_size = sizeof(r);
    r.abi_version = HASTEN_ABI_VERSION;
    call("memory_report", [&] { return vt().strategy.memory_report(instance_, &r); });
    return r;
  }
  bool has_state_dict() const { return vt().strategy.state_dict != nullptr; }
  std::vector<std::pair<std::string, torch::Tensor>> state_dict(torch::nn::Module& model, int32_t kind) {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    auto emit = [](void* ctx, const char* name, hasten_tensor* value) {
      auto* v = static_cast<std::vector<std::pair<std::string, torch::Tensor>>*>(ctx);
      v->emplace_back(name, *reinterpret_cast<torch::Tensor*>(value));
    };
    call("state_dict", [&] { return vt().strategy.state_dict(instance_, h(model), kind, emit, &out); });
    return out;
  }
  // state_dict, one tensor at a time: `each` sees every tensor as the strategy emits it.
  void state_dict_each(torch::nn::Module& model, int32_t kind,
                       const std::function<void(const std::string&, torch::Tensor&)>& each) {
    auto emit = [](void* ctx, const char* name, hasten_tensor* value) {
      (*static_cast<const std::function<void(const std::string&, torch::Tensor&)>*>(ctx))(
          name, *reinterpret_cast<torch::Tensor*>(value));
    };
    call("state_dict", [&] {
      return vt().strategy.state_dict(instance_, h(model), kind, emit,
                                      const_cast<std::function<void(const std::string&, torch::Tensor&)>*>(&each));
    });
  }
  bool has_load_state_dict() const { return vt().strategy.load_state_dict != nullptr; }
  void load_state_dict(torch::nn::Module& model, const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
    const Borrowed b(tensors);
    call("load_state_dict", [&] {
      return vt().strategy.load_state_dict(instance_, h(model), b.names.data(), b.values.data(),
                                           static_cast<uint32_t>(b.names.size()));
    });
  }
  // ABI 1.5: the strategy asks for the ranges it keeps; `read` fills them (throwing what it
  // likes: the first exception it threw is rethrown here as it was, a damaged file included).
  using ReadRange = std::function<void(const std::string& name, c10::IntArrayRef shape, int64_t offset, torch::Tensor& dst)>;
  bool has_load_state_dict_ranges() const { return vt().strategy.load_state_dict_ranges != nullptr; }
  void load_state_dict_ranges(torch::nn::Module& model, const ReadRange& read) {
    struct Ctx {
      const ReadRange* read;
      std::exception_ptr error;
    } ctx{&read, nullptr};
    auto trampoline = [](void* c, const char* name, const int64_t* shape, uint32_t ndim, int64_t offset,
                         hasten_tensor* dst) -> hasten_status {
      auto* x = static_cast<Ctx*>(c);
      try {
        (*x->read)(name, c10::IntArrayRef(shape, ndim), offset, *reinterpret_cast<torch::Tensor*>(dst));
        return HASTEN_OK;
      } catch (...) {
        if (!x->error) x->error = std::current_exception();
        return HASTEN_ERR_INVALID_ARGUMENT;
      }
    };
    try {
      call("load_state_dict_ranges", [&] { return vt().strategy.load_state_dict_ranges(instance_, h(model), trampoline, &ctx); });
    } catch (...) {
      if (ctx.error) std::rethrow_exception(ctx.error);
      throw;
    }
    if (ctx.error) std::rethrow_exception(ctx.error);  // a strategy that swallowed the failure
  }
  bool has_optimizer_state() const { return vt().strategy.optimizer_state != nullptr; }
  std::vector<std::pair<std::string, torch::Tensor>> optimizer_state(torch::optim::Optimizer& optimizer,
                                                                     torch::nn::Module& model) {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    auto emit = [](void* ctx, const char* name, hasten_tensor* value) {
      auto* v = static_cast<std::vector<std::pair<std::string, torch::Tensor>>*>(ctx);
      v->emplace_back(name, *reinterpret_cast<torch::Tensor*>(value));
    };
    call("optimizer_state", [&] { return vt().strategy.optimizer_state(instance_, h(optimizer), h(model), emit, &out); });
    return out;
  }
  bool has_load_optimizer_state() const { return vt().strategy.load_optimizer_state != nullptr; }
  void load_optimizer_state(torch::optim::Optimizer& optimizer, torch::nn::Module& model,
                            const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
    const Borrowed b(tensors);
    call("load_optimizer_state", [&] {
      return vt().strategy.load_optimizer_state(instance_, h(optimizer), h(model), b.names.data(), b.values.data(),
                                                static_cast<uint32_t>(b.names.size()));
    });
  }
  bool has_clip_grad_norm() const { return vt().strategy.clip_grad_norm != nullptr; }
  double clip_grad_norm(torch::nn::Module& model, double max_norm, double norm_type) {
    double total = 0;
    call("clip_grad_norm", [&] {
      return vt().strategy.clip_grad_norm(instance_, h(model), max_norm, norm_type, &total);
    });
    return total;
  }

 private:
  // Named tensors as the ABI passes them: parallel arrays of borrowed names and handles.
  struct Borrowed {
    explicit Borrowed(const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
      for (auto& [name, value] : tensors) {
        names.push_back(name.c_str());
        values.push_back(reinterpret_cast<hasten_tensor*>(const_cast<torch::Tensor*>(&value)));
      }
    }
    std::vector<const char*> names;
    std::vector<hasten_tensor*> values;
  };
  static hasten_module* h(torch::nn::Module& m) { return reinterpret_cast<hasten_module*>(&m); }
  static hasten_optimizer* h(torch::optim::Optimizer& o) {
    return reinterpret_cast<hasten_optimizer*>(&o);
  }
};

}  // namespace hasten::detail
