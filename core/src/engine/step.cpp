// The step of a training loop: optimizer and scheduler stepping (skipped on accumulation
// micro-batches and on non-finite gradients), backward with loss scaling, gradient clipping
// and unscaling.
#include <hasten/error.hpp>
#include <hasten/torch_compat.hpp>

#include <torch/nn/utils/clip_grad.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "engine/engine_state.hpp"
#include "parallel/split_parameters.hpp"
#include "util/trace_ranges.hpp"

namespace hasten::detail {

// ---- optimizers and schedulers ------------------------------------------------------------

size_t Engine::add_optimizer(torch::optim::Optimizer& optimizer, std::shared_ptr<void> owner) {
  Impl& s = *impl_;
  for (size_t i = 0; i < s.optimizers.size(); ++i)
    if (s.optimizers[i].optimizer == &optimizer) return i;
  // The models this optimizer steps (before a sharding strategy swaps its parameters for
  // shards). Under such a strategy a parameter of no prepared model would stay whole and
  // unreduced on every rank: its model was not prepared (or not before the optimizer).
  OptimizerEntry entry{&optimizer, std::move(owner), false, {}};
  std::set<const void*> unclaimed;
  for (auto& group : optimizer.param_groups())
    for (auto& p : group.params()) unclaimed.insert(p.unsafeGetTensorImpl());
  for (size_t m = 0; m < s.models.size(); ++m) {
    bool steps_it = false;
    for (auto& p : s.models[m].module->parameters()) steps_it = unclaimed.erase(p.unsafeGetTensorImpl()) > 0 || steps_it;
    if (steps_it) entry.models.push_back(m);
  }
  if (s.strategy->has_state_dict() && !unclaimed.empty())
    throw UsageError("prepare: " + std::to_string(unclaimed.size()) + " parameter" + (unclaimed.size() == 1 ? "" : "s") +
                     " of this optimizer belong to no prepared model, and strategy '" + s.strategy->name() +
                     "' shards only the parameters of prepared models; prepare the model with (or before) its "
                     "optimizer: acc.prepare(model, optimizer)");
  s.strategy->prepare_optimizer(optimizer);
  s.optimizers.push_back(std::move(entry));
  return s.optimizers.size() - 1;
}

torch::optim::Optimizer& Engine::optimizer(size_t index) { return *impl_->optimizers.at(index).optimizer; }

void Engine::optimizer_step(size_t index) {
  Impl& s = *impl_;
  if (!s.accumulation.sync) return;  // an accumulation micro-batch
  OptimizerEntry& e = s.optimizers.at(index);
  s.join_round_before_step(index);  // inside join_uneven_inputs under zero1/zero2 (join.cpp)
  s.step_optimizer(e);
  if (index == 0) {
    ++s.profiling.step;
    s.profile_tick();
  }
}

void Engine::Impl::step_optimizer(OptimizerEntry& e) {
  TraceRange range("hasten::optimizer_step");
  const bool skip = precision->before_step(*e.optimizer);
  if (!skip) {
    strategy->before_optimizer_step(*e.optimizer);
    e.optimizer->step();
    strategy->after_optimizer_step(*e.optimizer);
  }
  precision->after_step(*e.optimizer, skip);
  e.last_skipped = skip;
}

void Engine::optimizer_zero_grad(size_t index) {
  if (!impl_->accumulation.sync) return;
  OptimizerEntry& e = impl_->optimizers.at(index);
  compat::zero_grad_in_place(*e.optimizer);
  e.join_zeroed = true;  // ranks out of batches zero theirs at the next join round (join.cpp)
}

bool Engine::optimizer_step_was_skipped(size_t index) const {
  return impl_->optimizers.at(index).last_skipped;
}

bool Engine::any_optimizer_step_skipped() const {
  for (auto& e : impl_->optimizers)
    if (e.last_skipped) return true;
  return false;
}

size_t Engine::add_scheduler(std::function<void()> step_once) {
  impl_->schedulers.push_back({std::move(step_once), 0});
  return impl_->schedulers.size() - 1;
}

void Engine::scheduler_stepped(size_t index) { ++impl_->schedulers.at(index).steps; }

int Engine::scheduler_steps_per_call() const {
  const Impl& s = *impl_;
  // Accelerate's AcceleratedScheduler: the loader's batch grew num_processes times, so the
  // schedule (built for the unprepared loader's length) steps that many times per step.
  if (!s.config.scheduler_steps_per_process || !s.config.step_scheduler_with_optimizer || s.config.split_batches)
    return 1;
  return s.process.world_size;
}

void Engine::scheduler_called(size_t index) {
  const Impl& s = *impl_;
  // AcceleratedScheduler.step: `if not sync_gradients: if adjust_scheduler: _step_count += 1`
  // (a skipped optimizer step is not counted).
  if (s.config.scheduler_steps_per_process && s.config.adjust_scheduler && s.config.step_scheduler_with_optimizer &&
      !s.accumulation.sync)
    ++impl_->schedulers.at(index).adjustments;
}

bool Engine::scheduler_bounded() const {
  const Impl& s = *impl_;
  // The guard lives in AcceleratedScheduler's num_processes loop, which split_batches skips.
  return s.config.scheduler_steps_per_process && s.config.step_scheduler_with_optimizer && !s.config.split_batches;
}

int64_t Engine::scheduler_adjustments(size_t index) const { return impl_->schedulers.at(index).adjustments; }

bool Engine::scheduler_should_step() const {
  const Impl& s = *impl_;
  if (!s.config.step_scheduler_with_optimizer) return true;
  if (!s.accumulation.sync) return false;
  return !any_optimizer_step_skipped();
}

// ---- backward and gradients ---------------------------------------------------------------

void Engine::backward(const torch::Tensor& loss, bool retain_graph) {
  TraceRange range("hasten::backward");
  Impl& s = *impl_;
  if (s.accumulation.depth == 0 && s.accumulation.scope_ended_unused && s.config.gradient_accumulation_steps > 1)
    throw UsageError("backward: the accumulate() scope of this micro-batch already ended (a discarded "
                     "`acc.accumulate(model);` ends at once), so this loss would be neither divided by the "
                     "accumulation steps nor kept local; keep the scope alive for the micro-batch: "
                     "`auto scope = acc.accumulate(model);`");
  s.check_prepared_forwards(loss);
  if (s.accumulation.depth > 0) s.accumulation.backward_in_scope = true;
  torch::Tensor l = loss;
  // The window's real length (hasten), or gradient_accumulation_steps even for a short last
  // window (short_window_loss_division: steps, Accelerate's arithmetic).
  const int64_t divisor = s.config.short_window_loss_division == "steps" ? s.config.gradient_accumulation_steps : s.accumulation.window;
  if (s.accumulation.depth > 0 && divisor > 1) l = l / static_cast<double>(divisor);
  // Inside join_uneven_inputs under zero1/zero2: tells the ranks out of batches to shadow
  // this backward (join.cpp).
  if (const double join_factor = s.join_round_before_backward(l); join_factor != 1.0) l = l * join_factor;
  s.precision->scale_loss(l);
  s.strategy->before_backward();
  l.backward({}, retain_graph);
  s.strategy->after_backward();
  s.join_reduce_after_backward();  // inside join_uneven_inputs (join.cpp)
}

namespace {
// Every prepared model's tensor-parallel parts, by TensorImpl (clip_grad_norm_'s norm sums
// their contribution over their group).
std::map<const void*, SplitLayout> split_parameters_of(const std::vector<ModelEntry>& models) {
  std::map<const void*, SplitLayout> out;
  for (auto& m : models) {
    const SplitLayouts layouts = split_layouts(*m.module);
    if (layouts.empty()) continue;
    for (auto& named : m.module->named_parameters())
      if (auto it = layouts.find(named.key()); it != layouts.end()) out[named.value().unsafeGetTensorImpl()] = it->second;
  }
  return out;
}
}  // namespace

double Engine::clip_grad_norm(size_t model, double max_norm, double norm_type) {
  Impl& s = *impl_;
  unscale_gradients();
  ModelEntry& e = s.models.at(model);
  if (s.strategy->has_clip_grad_norm()) {
    s.join_round_before_clip(model, max_norm, norm_type);  // the norm is a collective over shards
    return s.strategy->clip_grad_norm(*e.module, max_norm, norm_type);
  }
  if (auto split = split_parameters_of(s.models); !split.empty())
    return clip_split_grad_norm(*this, e.module->parameters(), split, max_norm, norm_type);
  return torch::nn::utils::clip_grad_norm_(e.module->parameters(), max_norm, norm_type);
}

std::optional<size_t> Engine::model_of_parameters(const std::vector<torch::Tensor>& parameters, const char* op) const {
  const Impl& s = *impl_;
  if (!s.strategy->has_state_dict()) return std::nullopt;  // gradients live in the parameters
  for (size_t m = 0; m < s.models.size(); ++m) {
    std::set<const void*> mine;
    for (auto& p : s.models[m].module->parameters()) mine.insert(p.unsafeGetTensorImpl());
    size_t hits = 0;
    for (auto& p : parameters) hits += mine.count(p.unsafeGetTensorImpl());
    if (hits == 0) continue;
    if (hits == parameters.size() && hits == mine.size()) return m;
    throw UsageError(std::string(op) + ": these are " + std::to_string(hits) + " of the " + std::to_string(mine.size()) +
                     " parameters of a model that " + s.strategy->name() +
                     " shards, whose gradients live in its shards; pass all of model->parameters() or the "
                     "prepared model itself");
  }
  return std::nullopt;
}

double Engine::clip_grad_norm(const std::vector<torch::Tensor>& parameters, double max_norm,
                              double norm_type) {
  // Accelerate's spelling, clip_grad_norm_(model->parameters(), ...): under a sharding
  // strategy the gradients are in the shards, so it means the model's clipping.
  if (auto m = model_of_parameters(parameters, "clip_grad_norm_")) return clip_grad_norm(*m, max_norm, norm_type);
  unscale_gradients();
  if (auto split = split_parameters_of(impl_->models); !split.empty())
    return clip_split_grad_norm(*this, parameters, split, max_norm, norm_type);
  return torch::nn::utils::clip_grad_norm_(parameters, max_norm, norm_type);
}

void Engine::clip_grad_value(size_t model, double clip_value) {
  Impl& s = *impl_;
  unscale_gradients();
  // A sparse .grad is the sharded strategies' placeholder at rest (an empty zero): nothing to
  // clip there, and LibTorch's clamp_ has no sparse kernel.
  std::vector<torch::Tensor> dense;
  for (auto& p : s.models.at(model).module->parameters())
    if (p.grad().defined() && !p.grad().is_sparse()) dense.push_back(p);
  torch::nn::utils::clip_grad_value_(dense, clip_value);
  // Under a sharding strategy the gradients the optimizers step are the shards' (the
  // parameters' own are freed between steps): clipping by value is element-wise, so clipping
  // each rank's shard clips the whole. Only the optimizers that step this model: another
  // model's gradients (a GAN's other network) are not this call's to clip. (An optimizer
  // shared by several models has one set of shards: all of it is clipped.)
  if (s.strategy->has_state_dict())
    for (auto& e : s.optimizers) {
      if (std::find(e.models.begin(), e.models.end(), model) == e.models.end()) continue;
      for (auto& group : e.optimizer->param_groups()) torch::nn::utils::clip_grad_value_(group.params(), clip_value);
    }
}

void Engine::clip_grad_value(const std::vector<torch::Tensor>& parameters, double clip_value) {
  if (auto m = model_of_parameters(parameters, "clip_grad_value_")) return clip_grad_value(*m, clip_value);
  unscale_gradients();
  torch::nn::utils::clip_grad_value_(parameters, clip_value);
}

void Engine::unscale_gradients() {
  for (auto& e : impl_->optimizers) impl_->precision->unscale_gradients(*e.optimizer);
}

double Engine::loss_scale() const { return impl_->precision->loss_scale(); }

}  // namespace hasten::detail
