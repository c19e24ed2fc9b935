// hasten::schedulers: the learning-rate schedules of HuggingFace transformers (and so of the
// Accelerate examples) that LibTorch 1.13 lacks, for any torch::optim optimizer.
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

// By transformers' SchedulerType name, as its get_scheduler: "linear", "cosine",
// "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup", each with its
// defaults; `warmup` and `total` are ignored where the schedule has no use for them. An
// unknown name is an error that lists the names and suggests the nearest.
LambdaLR make(const std::string& name, torch::optim::Optimizer& optimizer, int64_t warmup, int64_t total);

}  // namespace hasten::schedulers
