#include "grad_scaler.hpp"

#include <hasten/plugin_torch.hpp>

#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>

#include <cmath>

namespace hasten::precision {

GradScaler::GradScaler(GradScalerOptions options, std::function<bool(bool)> any_rank_found_inf)
    : options_(options), any_rank_found_inf_(std::move(any_rank_found_inf)), scale_(options.init_scale) {
  auto bad = [](const std::string& what) { throw sdk::Error(HASTEN_ERR_INVALID_ARGUMENT, what); };
  if (!(options_.init_scale > 0) || !std::isfinite(options_.init_scale))
    bad("init_scale must be a positive number, got " + std::to_string(options_.init_scale));
  if (!(options_.growth_factor > 1.0))
    bad("growth_factor must be > 1, got " + std::to_string(options_.growth_factor));
  if (!(options_.backoff_factor > 0.0 && options_.backoff_factor < 1.0))
    bad("backoff_factor must be in (0, 1), got " + std::to_string(options_.backoff_factor));
  if (options_.growth_interval < 1)
    bad("growth_interval must be >= 1, got " + std::to_string(options_.growth_interval));
}

torch::Tensor GradScaler::scale_loss(const torch::Tensor& loss) const {
  if (!options_.enabled) return loss;
  return loss * scale_;
}

void GradScaler::unscale(torch::optim::Optimizer& optimizer) {
  StepState& st = steps_[&optimizer];
  if (st.unscaled || !options_.enabled) return;
  std::vector<torch::Tensor> cuda_grads;
  torch::Tensor found;  // CPU accumulation of "any non-finite"
  const double inv = 1.0 / scale_;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      torch::Tensor g = p.mutable_grad();
      if (g.is_cuda()) {
        cuda_grads.push_back(g);
        continue;
      }
      torch::Tensor bad = torch::isfinite(g).logical_not().any();
      found = found.defined() ? found.logical_or(bad) : bad;
      g.mul_(inv);
    }
  }
  bool found_inf = found.defined() && found.item<bool>();
  if (!cuda_grads.empty()) {
    auto device = cuda_grads.front().device();
    auto found_t = torch::zeros({1}, torch::TensorOptions().dtype(torch::kFloat).device(device));
    auto inv_t = torch::full({1}, inv, torch::TensorOptions().dtype(torch::kFloat).device(device));
    at::_amp_foreach_non_finite_check_and_unscale_(cuda_grads, found_t, inv_t);
    found_inf = found_inf || found_t.item<float>() > 0;
  }
  st.found_inf = any_rank_found_inf_ ? any_rank_found_inf_(found_inf) : found_inf;
  st.unscaled = true;
}

bool GradScaler::should_skip(torch::optim::Optimizer& optimizer) {
  unscale(optimizer);
  return steps_[&optimizer].found_inf;
}

void GradScaler::update(torch::optim::Optimizer& optimizer, bool skipped) {
  steps_.erase(&optimizer);
  if (!options_.enabled) return;
  if (skipped) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
    return;
  }
  if (++growth_tracker_ == options_.growth_interval) {
    const double grown = scale_ * options_.growth_factor;
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  }
}

}  // namespace hasten::precision
