// Entry point of libhasten-strategy-sharded.so: strategies "zero" (DeepSpeed's vocabulary,
// presets zero1, zero2, zero3, zero2_offload, zero3_offload) and "fsdp" (FSDP's).
#include "sharded_strategy.hpp"

namespace {

using hasten::sharded::ShardedStrategy;


class ZeroStrategy final : public hasten::sdk::Strategy {
 public:
  ZeroStrategy(const hasten_host_api* host, std::string_view options)
      : Strategy(host), impl_(host, hasten::sharded::parse_zero_options(options)) {}
#define HASTEN_FORWARD_STRATEGY                                                                                \
  void prepare_model(torch::nn::Module& m, const hasten_model_info& i) override { impl_.prepare_model(m, i); } \
  void prepare_optimizer(torch::optim::Optimizer& o) override { impl_.prepare_optimizer(o); }                  \
  void set_gradient_sync(torch::nn::Module& m, bool e) override { impl_.set_gradient_sync(m, e); }            \
  void before_backward() override { impl_.before_backward(); }                                                 \
  void after_backward() override { impl_.after_backward(); }                                                   \
  void before_optimizer_step(torch::optim::Optimizer& o) override { impl_.before_optimizer_step(o); }          \
  void after_optimizer_step(torch::optim::Optimizer& o) override { impl_.after_optimizer_step(o); }            \
  double clip_grad_norm(torch::nn::Module& m, double n, double t) override { return impl_.clip_grad_norm(m, n, t); } \
  void unit_pre_forward(torch::nn::Module& m, uint32_t u) override { impl_.unit_pre_forward(m, u); }          \
  void unit_post_forward(torch::nn::Module& m, uint32_t u, at::Tensor* const* o, uint32_t n) override {        \
    impl_.unit_post_forward(m, u, o, n);                                                                        \
  }                                                                                                             \
  void memory_report(hasten_memory_report& r) override { impl_.memory_report(r); }                            \
  void state_dict(torch::nn::Module& m, int32_t k, const Emit& e) override { impl_.state_dict(m, k, e); }
  HASTEN_FORWARD_STRATEGY

 private:
  ShardedStrategy impl_;
};

class FsdpStrategy final : public hasten::sdk::Strategy {
 public:
  FsdpStrategy(const hasten_host_api* host, std::string_view options)
      : Strategy(host),
        impl_(host, hasten::sharded::parse_fsdp_options(options, hasten::sdk::process_info(host).num_nodes)) {}
  HASTEN_FORWARD_STRATEGY

 private:
  ShardedStrategy impl_;
};
#undef HASTEN_FORWARD_STRATEGY

constexpr hasten_preset kZeroPresets[] = {
    hasten::sdk::make_preset("zero1", "ZeRO stage 1: optimizer state sharded", R"({"stage": 1})"),
    hasten::sdk::make_preset("zero2", "ZeRO stage 2: + gradients sharded", R"({"stage": 2})"),
    hasten::sdk::make_preset("zero3", "ZeRO stage 3: + parameters sharded at rest", R"({"stage": 3})"),
    hasten::sdk::make_preset("zero2_offload", "stage 2, optimizer state and step on the CPU",
                             R"({"stage": 2, "offload_optimizer_device": "cpu"})"),
    hasten::sdk::make_preset("zero3_offload", "stage 3, parameter shards and optimizer on the CPU",
                             R"({"stage": 3, "offload_optimizer_device": "cpu", "offload_param_device": "cpu"})"),
};

constexpr hasten_plugin_descriptor kZero = hasten::sdk::strategy_descriptor<ZeroStrategy>(
    "zero", "1.0", "ZeRO stages 0-3 with CPU offload (DeepSpeed's options)", kZeroPresets,
    sizeof(kZeroPresets) / sizeof(kZeroPresets[0]));
constexpr hasten_plugin_descriptor kFsdp = hasten::sdk::strategy_descriptor<FsdpStrategy>(
    "fsdp", "1.0", "fully sharded data parallel (FSDP's options)");

}  // namespace

HASTEN_PLUGIN_LIBRARY(&kZero, &kFsdp)
