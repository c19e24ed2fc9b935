// Precision "fp16": forward under CUDA autocast to float16 with dynamic loss scaling.
// float16 autocast needs a GPU, so a CPU run is refused when the Accelerator learns its device
// (the check_device slot, called by the Accelerator constructor), unless
// precision_options.cpu_scaler_only is true: then the forward stays float32 and only the loss
// scaler runs (to exercise scaling and step skipping on machines without a GPU).
#include <hasten/plugin_torch.hpp>

#include "autocast.hpp"
#include "descriptors.hpp"
#include "grad_scaler.hpp"

#include <cstdio>
#include <string>

namespace hasten::precision {

constexpr hasten_option_spec kFp16Options[] = {
    sdk::OptionSpec("init_scale", HASTEN_OPTION_FLOAT, "The first loss scale").default_json("65536"),
    sdk::OptionSpec("growth_factor", HASTEN_OPTION_FLOAT, "Scale multiplier after growth_interval finite steps")
        .default_json("2"),
    sdk::OptionSpec("backoff_factor", HASTEN_OPTION_FLOAT, "Scale multiplier after a step with inf/NaN gradients")
        .default_json("0.5"),
    sdk::OptionSpec("growth_interval", HASTEN_OPTION_INT, "Finite steps between scale growths").default_json("2000"),
    sdk::OptionSpec("enabled", HASTEN_OPTION_BOOL, "false: no loss scaling").default_json("true"),
    sdk::OptionSpec("cpu_scaler_only", HASTEN_OPTION_BOOL,
                    "On the CPU: float32 forward, only the loss scaler runs (for tests without a GPU)")
        .default_json("false"),
};

namespace {

// Keys and types were checked by the host against kFp16Options; an absent key is its
// default_json there.
GradScalerOptions parse_options(const hasten_host_api* host, std::string_view text, bool* cpu_scaler_only) {
  const sdk::Options in(host, text, kFp16Options);
  GradScalerOptions o;
  o.init_scale = in.number("init_scale").value();
  o.growth_factor = in.number("growth_factor").value();
  o.backoff_factor = in.number("backoff_factor").value();
  o.growth_interval = in.integer("growth_interval").value();
  o.enabled = in.boolean("enabled").value();
  *cpu_scaler_only = in.boolean("cpu_scaler_only").value();
  return o;
}

class Fp16Precision final : public sdk::Precision {
 public:
  Fp16Precision(const hasten_host_api* host, std::string_view options)
      : Precision(host),
        scaler_(parse_options(host, options, &cpu_scaler_only_),
                [host](bool found) { return any_rank(host, found); }) {}

  void check_device(const DLDevice& device) override {
    if (device.device_type == kDLCPU && !cpu_scaler_only_)
      throw sdk::Error(HASTEN_ERR_UNSUPPORTED,
                       "mixed_precision 'fp16' needs a CUDA device, and this run's device is the "
                       "CPU (allowed on CPU: no, bf16; or precision_options.cpu_scaler_only: true "
                       "to run only the loss scaler)");
  }
  void* autocast_enter(const DLDevice& device) override {
    if (device.device_type == kDLCUDA)
      AutocastStack::enter(device, at::kHalf);
    else
      AutocastStack::enter_noop();
    return nullptr;
  }
  void autocast_exit(void*) override { AutocastStack::exit(); }
  void scale_loss(at::Tensor& loss) override { loss = scaler_.scale_loss(loss); }
  void unscale_gradients(torch::optim::Optimizer& optimizer) override { scaler_.unscale(optimizer); }
  bool before_step(torch::optim::Optimizer& optimizer) override {
    return scaler_.should_skip(optimizer);
  }
  void after_step(torch::optim::Optimizer& optimizer, bool skipped) override {
    scaler_.update(optimizer, skipped);
  }
  double loss_scale() override { return scaler_.scale(); }
  // The scaler's scale and growth tracker, as PyTorch's GradScaler.state_dict() keeps them: a
  // resumed run continues with the scale the straight run has at that step.
  std::string state_dict() override {
    char scale[32];
    std::snprintf(scale, sizeof scale, "%.17g", scaler_.scale());
    return std::string("{\"scale\": ") + scale + ", \"growth_tracker\": " + std::to_string(scaler_.growth_tracker()) + "}";
  }
  void load_state_dict(const std::string& json) override {
    const sdk::Options in(host(), json);
    const auto scale = in.number("scale");
    const auto tracker = in.integer("growth_tracker");
    if (!scale || !tracker || !(*scale > 0) || *tracker < 0)
      throw sdk::Error(HASTEN_ERR_INVALID_ARGUMENT,
                       "fp16 state: expected {\"scale\": a number > 0, \"growth_tracker\": an integer >= 0}, got " + json);
    scaler_.restore(*scale, *tracker);
  }

 private:
  // Every rank must skip together: a non-finite gradient anywhere skips the step everywhere.
  static bool any_rank(const hasten_host_api* host, bool found) {
    return sdk::allreduce_scalar(host, found ? 1.0 : 0.0, HASTEN_REDUCE_MAX) > 0.0;
  }

  bool cpu_scaler_only_ = false;
  GradScaler scaler_;
};

}  // namespace


const hasten_plugin_descriptor kFp16Descriptor = sdk::with_options(
    sdk::precision_descriptor<Fp16Precision>("fp16", "1.0", "CUDA autocast to float16 with dynamic loss scaling"),
    kFp16Options);

}  // namespace hasten::precision
