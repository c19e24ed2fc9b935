// The transformers learning-rate schedules (transformers/optimization.py, the lr_lambda of
// each get_*_schedule_with_warmup) on a LambdaLR for LibTorch.
#include <hasten/error.hpp>
#include <hasten/schedulers.hpp>

#include <c10/util/Exception.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>

#include "util/text_util.hpp"

namespace hasten::schedulers {

namespace {

constexpr double kPi = 3.14159265358979323846;  // Python's math.pi

// Numbers in messages as a user wrote them: 1e-07, 0.5, 3.
std::string num(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

void check_warmup(const char* schedule, int64_t warmup) {
  if (warmup < 0) throw Error(std::string(schedule) + ": warmup (" + std::to_string(warmup) + ") must be >= 0");
}

// The decaying schedules divide by total - warmup (at least 1) and need a decay to schedule:
// total <= warmup would give a schedule of warmup alone, with a cosine that flips between
// its ends or a polynomial that divides by zero.
void check_span(const char* schedule, int64_t warmup, int64_t total) {
  check_warmup(schedule, warmup);
  if (total <= warmup)
    throw Error(std::string(schedule) + ": total (" + std::to_string(total) + ") must be greater than warmup (" +
                std::to_string(warmup) + "): the decay needs at least one step");
}

// float(step) / float(max(1, warmup)), shared by every schedule with a warmup.
double warming(int64_t step, int64_t warmup) {
  return static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup));
}

// float(step - warmup) / float(max(1, total - warmup))
double progress(int64_t step, int64_t warmup, int64_t total) {
  return static_cast<double>(step - warmup) / static_cast<double>(std::max<int64_t>(1, total - warmup));
}

}  // namespace

LambdaLR::LambdaLR(torch::optim::Optimizer& optimizer, Factor factor)
    : torch::optim::LRScheduler(optimizer), target_(optimizer), factor_(std::move(factor)) {
  if (!factor_) throw Error("LambdaLR: the factor function is empty");
  // LibTorch's count starts at 0 (1.13 and 2.x); set here so that no release's default matters.
  step_count_ = 0;
  for (auto& group : target_.param_groups()) {
    try {
      base_lrs_.push_back(group.options().get_lr());
    } catch (const c10::Error&) {
      throw Error(
          "LambdaLR: the optimizer's options do not implement get_lr(), so its learning rate cannot be scheduled");
    }
  }
  // PyTorch's LambdaLR steps once when built: the first optimizer step already uses factor(0)
  // (0 for a warmup). LibTorch's LRScheduler does not, so set the lrs here.
  last_lr_ = lrs_at(0);
  auto& groups = target_.param_groups();
  for (size_t i = 0; i < groups.size(); ++i) groups[i].options().set_lr(last_lr_[i]);
}

std::vector<double> LambdaLR::lrs_at(int64_t step) const {
  const double f = factor_(step);
  std::vector<double> lrs;
  lrs.reserve(base_lrs_.size());
  for (double base : base_lrs_) lrs.push_back(base * f);
  return lrs;
}

std::vector<double> LambdaLR::get_lrs() {
  const size_t groups = target_.param_groups().size();
  if (groups != base_lrs_.size())
    throw Error("LambdaLR: the optimizer has " + std::to_string(groups) + " param groups, " +
                std::to_string(base_lrs_.size()) +
                " when the scheduler was built; build the scheduler after add_param_group");
  last_lr_ = lrs_at(static_cast<int64_t>(step_count_) + 1);
  return last_lr_;
}

LambdaLR constant(torch::optim::Optimizer& optimizer) {
  return LambdaLR(optimizer, [](int64_t) { return 1.0; });
}

LambdaLR constant_with_warmup(torch::optim::Optimizer& optimizer, int64_t warmup) {
  check_warmup("constant_with_warmup", warmup);
  return LambdaLR(optimizer, [warmup](int64_t step) { return step < warmup ? warming(step, warmup) : 1.0; });
}

LambdaLR linear_with_warmup(torch::optim::Optimizer& optimizer, int64_t warmup, int64_t total) {
  check_span("linear_with_warmup", warmup, total);
  return LambdaLR(optimizer, [warmup, total](int64_t step) {
    if (step < warmup) return warming(step, warmup);
    return std::max(0.0, static_cast<double>(total - step) / static_cast<double>(std::max<int64_t>(1, total - warmup)));
  });
}

LambdaLR cosine_with_warmup(torch::optim::Optimizer& optimizer, int64_t warmup, int64_t total, double num_cycles) {
  check_span("cosine_with_warmup", warmup, total);
  if (!(num_cycles > 0) || !std::isfinite(num_cycles))
    throw Error("cosine_with_warmup: num_cycles (" + num(num_cycles) + ") must be > 0");
  return LambdaLR(optimizer, [warmup, total, num_cycles](int64_t step) {
    if (step < warmup) return warming(step, warmup);
    return std::max(0.0, 0.5 * (1.0 + std::cos(kPi * num_cycles * 2.0 * progress(step, warmup, total))));
  });
}

LambdaLR cosine_with_hard_restarts_with_warmup(torch::optim::Optimizer& optimizer, int64_t warmup, int64_t total,
                                               int64_t num_cycles) {
  check_span("cosine_with_hard_restarts_with_warmup", warmup, total);
  if (num_cycles <= 0)
    throw Error("cosine_with_hard_restarts_with_warmup: num_cycles (" + std::to_string(num_cycles) + ") must be > 0");
  return LambdaLR(optimizer, [warmup, total, num_cycles](int64_t step) {
    if (step < warmup) return warming(step, warmup);
    const double p = progress(step, warmup, total);
    if (p >= 1.0) return 0.0;
    // Python's % on a non-negative float is fmod.
    return std::max(0.0, 0.5 * (1.0 + std::cos(kPi * std::fmod(static_cast<double>(num_cycles) * p, 1.0))));
  });
}

LambdaLR polynomial_decay_with_warmup(torch::optim::Optimizer& optimizer, int64_t warmup, int64_t total, double lr_end,
                                      double power) {
  check_span("polynomial_decay_with_warmup", warmup, total);
  double lr_init = 0;
  try {
    lr_init = optimizer.defaults().get_lr();
  } catch (const c10::Error&) {
    throw Error("polynomial_decay_with_warmup: the optimizer's options do not implement get_lr()");
  }
  // transformers refuses lr_end >= lr_init; a negative lr_end or a power <= 0 (no decay, or a
  // division by zero at `total`) are refused here too rather than trained on.
  if (!(lr_end >= 0) || !std::isfinite(lr_end))
    throw Error("polynomial_decay_with_warmup: lr_end (" + num(lr_end) + ") must be >= 0");
  if (!(lr_init > lr_end))
    throw Error("polynomial_decay_with_warmup: lr_end (" + num(lr_end) +
                ") must be smaller than the optimizer's initial lr (" + num(lr_init) + ")");
  if (!(power > 0) || !std::isfinite(power))
    throw Error("polynomial_decay_with_warmup: power (" + num(power) + ") must be > 0");
  return LambdaLR(optimizer, [warmup, total, lr_end, power, lr_init](int64_t step) {
    if (step < warmup) return warming(step, warmup);
    if (step > total) return lr_end / lr_init;  // LambdaLR multiplies by the base lr
    const double remaining = 1.0 - static_cast<double>(step - warmup) / static_cast<double>(total - warmup);
    return ((lr_init - lr_end) * std::pow(remaining, power) + lr_end) / lr_init;
  });
}

LambdaLR make(const std::string& name, torch::optim::Optimizer& optimizer, int64_t warmup, int64_t total) {
  if (name == "linear") return linear_with_warmup(optimizer, warmup, total);
  if (name == "cosine") return cosine_with_warmup(optimizer, warmup, total);
  if (name == "cosine_with_restarts") return cosine_with_hard_restarts_with_warmup(optimizer, warmup, total);
  if (name == "polynomial") return polynomial_decay_with_warmup(optimizer, warmup, total);
  if (name == "constant") return constant(optimizer);
  if (name == "constant_with_warmup") return constant_with_warmup(optimizer, warmup);
  const std::vector<std::string> known = {"linear",   "cosine",   "cosine_with_restarts",
                                          "polynomial", "constant", "constant_with_warmup"};
  std::string msg = "schedulers::make: unknown schedule '" + name + "'";
  const std::string near = detail::nearest(name, known);
  if (!near.empty()) msg += "; did you mean '" + near + "'?";
  throw Error(msg + " (known: " + detail::join(known, ", ") + ")");
}

}  // namespace hasten::schedulers

// ---- OneCycleLR ---------------------------------------------------------------------------

namespace hasten::schedulers {

namespace {

// The momentum a param group's options carry under cycle_momentum, as PyTorch picks it:
// beta1 of an optimizer with betas, else its momentum. nullptr: neither.
double* momentum_of(torch::optim::OptimizerOptions& o) {
  if (auto* a = dynamic_cast<torch::optim::AdamWOptions*>(&o)) return &std::get<0>(a->betas());
  if (auto* a = dynamic_cast<torch::optim::AdamOptions*>(&o)) return &std::get<0>(a->betas());
  if (auto* a = dynamic_cast<torch::optim::SGDOptions*>(&o)) return &a->momentum();
  if (auto* a = dynamic_cast<torch::optim::RMSpropOptions*>(&o)) return &a->momentum();
  return nullptr;
}

}  // namespace

OneCycleLR::OneCycleLR(torch::optim::Optimizer& optimizer, double max_lr, int64_t total_steps, OneCycleOptions options)
    : OneCycleLR(optimizer, std::vector<double>(optimizer.param_groups().size(), max_lr), total_steps,
                 std::move(options)) {}

OneCycleLR::OneCycleLR(torch::optim::Optimizer& optimizer, std::vector<double> max_lrs, int64_t total_steps,
                       OneCycleOptions options)
    : torch::optim::LRScheduler(optimizer), target_(optimizer), total_steps_(total_steps), options_(std::move(options)) {
  step_count_ = 0;  // LibTorch 1.13 starts at 0; later releases leave it uninitialised
  if (total_steps <= 0)
    throw Error("OneCycleLR: total_steps (" + std::to_string(total_steps) + ") must be a positive integer");
  if (!(options_.pct_start >= 0 && options_.pct_start <= 1))
    throw Error("OneCycleLR: pct_start (" + num(options_.pct_start) + ") must be between 0 and 1");
  if (options_.anneal_strategy != "cos" && options_.anneal_strategy != "linear")
    throw Error("OneCycleLR: anneal_strategy '" + options_.anneal_strategy + "' is not one of cos, linear");
  auto& groups = target_.param_groups();
  if (max_lrs.size() != groups.size())
    throw Error("OneCycleLR: " + std::to_string(max_lrs.size()) + " max_lr values for " +
                std::to_string(groups.size()) + " param groups; give one, or one per group");
  if (options_.cycle_momentum)
    for (auto& g : groups)
      if (!momentum_of(g.options()))
        throw Error("OneCycleLR: cycle_momentum needs an optimizer with betas (Adam, AdamW) or momentum (SGD, "
                    "RMSprop); set cycle_momentum = false for this one");
  const double T = static_cast<double>(total_steps);
  if (options_.three_phase)
    phases_ = {{options_.pct_start * T - 1, 0, 1, 1, 0},
               {2 * options_.pct_start * T - 2, 1, 0, 0, 1},
               {T - 1, 0, 2, 1, 1}};
  else
    phases_ = {{options_.pct_start * T - 1, 0, 1, 1, 0}, {T - 1, 1, 2, 0, 1}};
  for (double max : max_lrs) {
    const double initial = max / options_.div_factor;
    group_lrs_.push_back({initial, max, initial / options_.final_div_factor});
  }
  // PyTorch's scheduler steps once when built: step 0's values hold for the first step.
  last_lr_ = apply_at(0);
  for (size_t i = 0; i < groups.size(); ++i) groups[i].options().set_lr(last_lr_[i]);
}

std::vector<double> OneCycleLR::apply_at(int64_t step) {
  auto& groups = target_.param_groups();
  if (groups.size() != group_lrs_.size())
    throw Error("OneCycleLR: the optimizer has " + std::to_string(groups.size()) + " param groups, " +
                std::to_string(group_lrs_.size()) + " when the scheduler was built; build the scheduler after "
                "add_param_group");
  auto anneal = [&](double start, double end, double pct) {
    if (options_.anneal_strategy == "linear") return (end - start) * pct + start;
    return end + (start - end) / 2.0 * (std::cos(kPi * pct) + 1);
  };
  const double momentum[2] = {options_.base_momentum, options_.max_momentum};
  const double s = static_cast<double>(step);
  std::vector<double> lrs;
  for (size_t g = 0; g < groups.size(); ++g) {
    double start = 0;
    for (size_t i = 0; i < phases_.size(); ++i) {
      const Phase& p = phases_[i];
      if (s <= p.end_step || i + 1 == phases_.size()) {
        // PyTorch divides by the phase's length: one of no length fails there (a division by
        // zero), here with a line naming it.
        if (p.end_step == start)
          throw Error("OneCycleLR: step " + std::to_string(step) + " falls in phase " + std::to_string(i + 1) +
                      " of the schedule, which has no steps (pct_start " + num(options_.pct_start) + ", total_steps " +
                      std::to_string(total_steps_) + ")");
        const double pct = (s - start) / (p.end_step - start);
        lrs.push_back(anneal(group_lrs_[g][p.start_lr], group_lrs_[g][p.end_lr], pct));
        if (options_.cycle_momentum) {
          double* m = momentum_of(groups[g].options());
          if (m) *m = anneal(momentum[p.start_momentum], momentum[p.end_momentum], pct);
        }
        break;
      }
      start = p.end_step;
    }
  }
  return lrs;
}

std::vector<double> OneCycleLR::get_lrs() {
  const int64_t next = static_cast<int64_t>(step_count_) + 1;
  if (next > total_steps_)
    throw Error("OneCycleLR: tried to step " + std::to_string(next) + " times; the specified number of total steps is " +
                std::to_string(total_steps_));
  last_lr_ = apply_at(next);
  return last_lr_;
}

}  // namespace hasten::schedulers
