// Dynamic loss scaling, as torch.cuda.amp.GradScaler does it: multiply the loss by `scale`,
// divide the gradients by it before the step, skip a step whose gradients hold inf or nan
// and halve the scale, double it after `growth_interval` good steps in a row. Device
// agnostic (CUDA uses the fused ATen kernel, other devices plain tensor ops), so the logic
// runs and is tested on a CPU.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <functional>
#include <unordered_map>

namespace hasten::precision {

// The scaler's settings; fp16's described options (fp16_precision.cpp, kFp16Options) hold
// their defaults (PyTorch's GradScaler's: 65536, 2, 0.5, 2000, enabled).
struct GradScalerOptions {
  double init_scale = 0;
  double growth_factor = 0;
  double backoff_factor = 0;
  int64_t growth_interval = 0;
  bool enabled = false;
};

class GradScaler {
 public:
  // any_rank_found_inf: combines this rank's finding with the others' (identity in one process).
  GradScaler(GradScalerOptions options, std::function<bool(bool)> any_rank_found_inf);

  torch::Tensor scale_loss(const torch::Tensor& loss) const;
  // Unscales the optimizer's gradients once per step and records whether any is non-finite.
  void unscale(torch::optim::Optimizer& optimizer);
  // True when the step must be skipped (unscales first if needed).
  bool should_skip(torch::optim::Optimizer& optimizer);
  // Updates the scale after the optimizer's step (or its skip).
  void update(torch::optim::Optimizer& optimizer, bool skipped);

  double scale() const { return scale_; }
  int64_t growth_tracker() const { return growth_tracker_; }
  // A checkpoint's scale and growth tracker (between steps: no step is under way).
  void restore(double scale, int64_t growth_tracker) {
    scale_ = scale;
    growth_tracker_ = growth_tracker;
  }

 private:
  struct StepState {
    bool unscaled = false;
    bool found_inf = false;
  };
  GradScalerOptions options_;
  std::function<bool(bool)> any_rank_found_inf_;
  double scale_;
  int64_t growth_tracker_ = 0;
  std::unordered_map<const torch::optim::Optimizer*, StepState> steps_;
};

}  // namespace hasten::precision
