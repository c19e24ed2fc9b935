// The transformers learning-rate schedules (transformers/optimization.py, the lr_lambda of
// each get_*_schedule_with_warmup) on a LambdaLR for LibTorch.
#include <hasten/error.hpp>
#include <hasten/schedulers.hpp>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>

#include "text_util.hpp"

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
  // LibTorch 1.13 starts the count at 0; later releases leave it uninitialised.
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
