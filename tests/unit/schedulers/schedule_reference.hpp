// What the scheduler tests check against: the transformers lr_lambdas and PyTorch's OneCycleLR,
// transcribed separately from hasten::schedulers, and an optimizer of two param groups.
#pragma once

#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace hasten::test::schedules {

// ---- the transformers lr_lambdas, transcribed line by line --------------------------------

namespace ref {

const double pi = 3.141592653589793;  // math.pi

inline double constant(int64_t) { return 1.0; }

inline double constant_with_warmup(int64_t current_step, int64_t num_warmup_steps) {
  if (current_step < num_warmup_steps) return double(current_step) / std::max(1.0, double(num_warmup_steps));
  return 1.0;
}

inline double linear(int64_t current_step, int64_t num_warmup_steps, int64_t num_training_steps) {
  if (current_step < num_warmup_steps) return double(current_step) / double(std::max<int64_t>(1, num_warmup_steps));
  return std::max(0.0, double(num_training_steps - current_step) /
                           double(std::max<int64_t>(1, num_training_steps - num_warmup_steps)));
}

inline double cosine(int64_t current_step, int64_t num_warmup_steps, int64_t num_training_steps, double num_cycles) {
  if (current_step < num_warmup_steps) return double(current_step) / double(std::max<int64_t>(1, num_warmup_steps));
  const double progress =
      double(current_step - num_warmup_steps) / double(std::max<int64_t>(1, num_training_steps - num_warmup_steps));
  return std::max(0.0, 0.5 * (1.0 + std::cos(pi * double(num_cycles) * 2.0 * progress)));
}

inline double cosine_hard_restarts(int64_t current_step, int64_t num_warmup_steps, int64_t num_training_steps,
                            int64_t num_cycles) {
  if (current_step < num_warmup_steps) return double(current_step) / double(std::max<int64_t>(1, num_warmup_steps));
  const double progress =
      double(current_step - num_warmup_steps) / double(std::max<int64_t>(1, num_training_steps - num_warmup_steps));
  if (progress >= 1.0) return 0.0;
  const double x = double(num_cycles) * progress;
  return std::max(0.0, 0.5 * (1.0 + std::cos(pi * (x - std::floor(x)))));  // Python's x % 1.0
}

inline double polynomial(int64_t current_step, int64_t num_warmup_steps, int64_t num_training_steps, double lr_init,
                  double lr_end, double power) {
  if (current_step < num_warmup_steps) return double(current_step) / double(std::max<int64_t>(1, num_warmup_steps));
  if (current_step > num_training_steps) return lr_end / lr_init;
  const double lr_range = lr_init - lr_end;
  const double decay_steps = double(num_training_steps - num_warmup_steps);
  const double pct_remaining = 1 - double(current_step - num_warmup_steps) / decay_steps;
  const double decay = lr_range * std::pow(pct_remaining, power) + lr_end;
  return decay / lr_init;
}

// torch/optim/lr_scheduler.py (1.13) OneCycleLR: __init__'s phases and get_lr, for one
// group; returns {lr, momentum} at step_num.
struct OneCycleRef {
  double max_lr;
  int64_t total_steps;
  double pct_start = 0.3;
  bool cos = true;
  bool three_phase = false;
  double base_momentum = 0.85, max_momentum = 0.95, div_factor = 25., final_div_factor = 1e4;

  std::pair<double, double> at(int64_t step_num) const {
    struct Phase {
      double end_step;
      const char *start_lr, *end_lr, *start_momentum, *end_momentum;
    };
    std::vector<Phase> phases;
    if (three_phase)
      phases = {{pct_start * total_steps - 1, "initial_lr", "max_lr", "max_momentum", "base_momentum"},
                {2 * pct_start * total_steps - 2, "max_lr", "initial_lr", "base_momentum", "max_momentum"},
                {double(total_steps - 1), "initial_lr", "min_lr", "max_momentum", "max_momentum"}};
    else
      phases = {{pct_start * total_steps - 1, "initial_lr", "max_lr", "max_momentum", "base_momentum"},
                {double(total_steps - 1), "max_lr", "min_lr", "base_momentum", "max_momentum"}};
    const double initial_lr = max_lr / div_factor;
    auto group = [&](const std::string& key) {
      if (key == "initial_lr") return initial_lr;
      if (key == "max_lr") return max_lr;
      if (key == "min_lr") return initial_lr / final_div_factor;
      if (key == "max_momentum") return max_momentum;
      return base_momentum;
    };
    auto anneal = [&](double start, double end, double pct) {
      if (cos) return end + (start - end) / 2.0 * (std::cos(pi * pct) + 1);
      return (end - start) * pct + start;
    };
    double start_step = 0;
    for (size_t i = 0; i < phases.size(); ++i) {
      const double end_step = phases[i].end_step;
      if (step_num <= end_step || i == phases.size() - 1) {
        const double pct = (step_num - start_step) / (end_step - start_step);
        return {anneal(group(phases[i].start_lr), group(phases[i].end_lr), pct),
                anneal(group(phases[i].start_momentum), group(phases[i].end_momentum), pct)};
      }
      start_step = phases[i].end_step;
    }
    return {0, 0};
  }
};

}  // namespace ref

// ---- helpers ------------------------------------------------------------------------------

inline constexpr double kLrA = 0.1;   // the optimizer's default lr: group 0
inline constexpr double kLrB = 0.02;  // group 1's own lr

// Two param groups of different lrs on a small linear layer.
struct TwoGroups {
  explicit TwoGroups(const std::string& kind = "sgd") {
    torch::manual_seed(0);
    net = torch::nn::Linear(4, 2);
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<torch::Tensor>{net->weight});
    if (kind == "sgd") {
      groups.emplace_back(std::vector<torch::Tensor>{net->bias}, std::make_unique<torch::optim::SGDOptions>(kLrB));
      opt = std::make_unique<torch::optim::SGD>(groups, torch::optim::SGDOptions(kLrA));
    } else {
      groups.emplace_back(std::vector<torch::Tensor>{net->bias}, std::make_unique<torch::optim::AdamWOptions>(kLrB));
      opt = std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(kLrA));
    }
  }
  std::vector<double> lrs() const {
    std::vector<double> out;
    for (auto& g : opt->param_groups()) out.push_back(g.options().get_lr());
    return out;
  }
  torch::nn::Linear net{nullptr};
  std::unique_ptr<torch::optim::Optimizer> opt;
};

}  // namespace hasten::test::schedules
