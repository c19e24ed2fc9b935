// Precision "fp16": forward under CUDA autocast to float16 with dynamic loss scaling.
// float16 autocast needs a GPU, so a CPU run is refused at prepare, unless
// precision_options.cpu_scaler_only is true: then the forward stays float32 and only the
// loss scaler runs (to exercise scaling and step skipping on machines without a GPU).
#include <hasten/plugin.hpp>

#include <nlohmann/json.hpp>

#include "autocast.hpp"
#include "descriptors.hpp"
#include "grad_scaler.hpp"

namespace hasten::precision {
namespace {

GradScalerOptions parse_options(std::string_view text, bool* cpu_scaler_only) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw sdk::Error(HASTEN_ERR_INVALID_ARGUMENT, "fp16 options are not a JSON object");
  GradScalerOptions o;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const auto& v = it.value();
    auto number = [&]() {
      if (!v.is_number())
        throw sdk::Error(HASTEN_ERR_INVALID_ARGUMENT,
                         "precision_options." + k + ": expected a number, got " + v.dump());
      return v.get<double>();
    };
    auto boolean = [&]() {
      if (!v.is_boolean())
        throw sdk::Error(HASTEN_ERR_INVALID_ARGUMENT,
                         "precision_options." + k + ": expected true or false, got " + v.dump());
      return v.get<bool>();
    };
    if (k == "init_scale") o.init_scale = number();
    else if (k == "growth_factor") o.growth_factor = number();
    else if (k == "backoff_factor") o.backoff_factor = number();
    else if (k == "growth_interval") {
      if (!v.is_number_integer())
        throw sdk::Error(HASTEN_ERR_INVALID_ARGUMENT,
                         "precision_options.growth_interval: expected an integer, got " + v.dump());
      o.growth_interval = v.get<int64_t>();
    } else if (k == "enabled") o.enabled = boolean();
    else if (k == "cpu_scaler_only") *cpu_scaler_only = boolean();
    else
      throw sdk::Error(HASTEN_ERR_INVALID_ARGUMENT,
                       "precision_options: unknown key '" + k +
                           "' for fp16 (allowed: init_scale, growth_factor, backoff_factor, "
                           "growth_interval, enabled, cpu_scaler_only)");
  }
  return o;
}

class Fp16Precision final : public sdk::Precision {
 public:
  Fp16Precision(const hasten_host_api* host, std::string_view options)
      : Precision(host),
        scaler_(parse_options(options, &cpu_scaler_only_),
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

 private:
  // Every rank must skip together: a non-finite gradient anywhere skips the step everywhere.
  static bool any_rank(const hasten_host_api* host, bool found) {
    return sdk::allreduce_scalar(host, found ? 1.0 : 0.0, HASTEN_REDUCE_MAX) > 0.0;
  }

  bool cpu_scaler_only_ = false;
  GradScaler scaler_;
};

}  // namespace

const hasten_plugin_descriptor kFp16Descriptor = sdk::precision_descriptor<Fp16Precision>(
    "fp16", "1.0", "CUDA autocast to float16 with dynamic loss scaling");

}  // namespace hasten::precision
