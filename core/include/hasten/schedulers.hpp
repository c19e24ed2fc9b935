// hasten::schedulers: the learning-rate schedules of HuggingFace transformers (and so of the
// Accelerate examples) that LibTorch lacks, for any torch::optim optimizer.
//
//   torch::optim::AdamW opt(net->parameters(), torch::optim::AdamWOptions(3e-4));
//   auto sched = hasten::schedulers::linear_with_warmup(opt, /*warmup=*/100, /*total=*/1000);
//   auto [model, o, s] = acc.prepare(net, opt, sched);  // s.step() once per real step
//
// Each is a LambdaLR with the factor function of transformers/optimization.py. As PyTorch's
// LambdaLR: building one sets every param group's lr to base_lr * factor(0), and after k
// calls to step() it is base_lr * factor(k), where base_lr is the group's lr when the
// scheduler was built. A bad argument is a hasten::Error with one line naming it.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace hasten::schedulers {

// Every param group's lr is its lr at construction times factor(step); the step starts at 0.
class LambdaLR : public torch::optim::LRScheduler {
 public:
  using Factor = std::function<double(int64_t step)>;

  // Throws hasten::Error if the optimizer's options cannot report their lr.
  LambdaLR(torch::optim::Optimizer& optimizer, Factor factor);

  // The lr of each param group as this scheduler last set it (PyTorch's get_last_lr).
  const std::vector<double>& get_last_lr() const { return last_lr_; }
  // How many times step() was called (PyTorch's last_epoch).
  int64_t last_step() const { return static_cast<int64_t>(step_count_); }
  // The lr of each param group when the scheduler was built.
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  // The schedule's multiplier at `step`.
  double factor(int64_t step) const { return factor_(step); }

 protected:
  // LRScheduler::step() calls this before it counts the step, so the lrs are for step + 1.
  std::vector<double> get_lrs() override;

 private:
  std::vector<double> lrs_at(int64_t step) const;

  torch::optim::Optimizer& target_;  // LRScheduler keeps its own reference private
  Factor factor_;
  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;
};

// The base lr throughout (get_constant_schedule).
LambdaLR constant(torch::optim::Optimizer& optimizer);

// From 0 up to the base lr over `warmup` steps, then constant.
LambdaLR constant_with_warmup(torch::optim::Optimizer& optimizer, int64_t warmup);

// Warmup, then linearly down to 0 at step `total` (0 after it).
LambdaLR linear_with_warmup(torch::optim::Optimizer& optimizer, int64_t warmup, int64_t total);

// Warmup, then a cosine over num_cycles periods from `warmup` to `total`: the default 0.5
// goes from the base lr down to 0 at `total`. As in transformers, the cosine continues past
// `total` (it rises again), so set `total` to the real number of steps.
LambdaLR cosine_with_warmup(torch::optim::Optimizer& optimizer, int64_t warmup, int64_t total,
                            double num_cycles = 0.5);

// Warmup, then num_cycles cosine decays from the base lr to 0, each restarting at the base
// lr; 0 from `total` on.
LambdaLR cosine_with_hard_restarts_with_warmup(torch::optim::Optimizer& optimizer, int64_t warmup, int64_t total,
                                               int64_t num_cycles = 1);

// Warmup, then from the optimizer's default lr (its defaults(), transformers' lr_init) down
// to lr_end as (1 - progress)^power, and lr_end after `total`. The factor is relative to
// lr_init, so a param group with its own lr scales the same way.
LambdaLR polynomial_decay_with_warmup(torch::optim::Optimizer& optimizer, int64_t warmup, int64_t total,
                                      double lr_end = 1e-7, double power = 1.0);

// PyTorch's OneCycleLR (torch/optim/lr_scheduler.py, 1.13), which LibTorch lacks: from
// max_lr / div_factor up to max_lr over the first pct_start of total_steps, then down to
// max_lr / div_factor / final_div_factor at total_steps (three_phase: up, back down to the
// start, then to the minimum), annealed by a cosine or linearly; with cycle_momentum the
// momentum (SGD, RMSprop) or beta1 (Adam, AdamW) moves the other way between max_momentum
// and base_momentum. As PyTorch's, building it sets the step-0 values, after k calls to
// step() the lr is the schedule's at step k, and a step past total_steps is an error.
// total_steps() makes a prepared scheduler bound it as Accelerate's AcceleratedScheduler
// does under scheduler_steps_per_process (docs/api.md, PreparedScheduler).
struct OneCycleOptions {
  double pct_start = 0.3;
  std::string anneal_strategy = "cos";  // or "linear"
  bool cycle_momentum = true;
  double base_momentum = 0.85;
  double max_momentum = 0.95;
  double div_factor = 25.0;
  double final_div_factor = 1e4;
  bool three_phase = false;
};

class OneCycleLR : public torch::optim::LRScheduler {
 public:
  // One max_lr for every param group, or one per group (PyTorch's list). Throws
  // hasten::Error naming a bad argument, or an optimizer without momentum or betas under
  // cycle_momentum.
  OneCycleLR(torch::optim::Optimizer& optimizer, double max_lr, int64_t total_steps, OneCycleOptions options = {});
  OneCycleLR(torch::optim::Optimizer& optimizer, std::vector<double> max_lrs, int64_t total_steps,
             OneCycleOptions options = {});

  const std::vector<double>& get_last_lr() const { return last_lr_; }
  // How many times step() was called (PyTorch's last_epoch).
  int64_t last_step() const { return static_cast<int64_t>(step_count_); }
  int64_t total_steps() const { return total_steps_; }

 protected:
  std::vector<double> get_lrs() override;

 private:
  // lr and momentum of each param group at `step`; momentum written into the groups.
  std::vector<double> apply_at(int64_t step);

  struct Phase {
    double end_step;
    int start_lr, end_lr;              // 0: initial, 1: max, 2: min lr
    int start_momentum, end_momentum;  // 0: base, 1: max momentum
  };
  torch::optim::Optimizer& target_;
  int64_t total_steps_;
  OneCycleOptions options_;
  std::vector<Phase> phases_;
  std::vector<std::array<double, 3>> group_lrs_;  // initial, max, min per group
  std::vector<double> last_lr_;
};

// By transformers' SchedulerType name, as its get_scheduler: "linear", "cosine",
// "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup", each with its
// defaults; `warmup` and `total` are ignored where the schedule has no use for them. An
// unknown name is an error that lists the names and suggests the nearest.
LambdaLR make(const std::string& name, torch::optim::Optimizer& optimizer, int64_t warmup, int64_t total);

}  // namespace hasten::schedulers
