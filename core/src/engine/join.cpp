// join_uneven_inputs: training on ranks with different numbers of batches (torch's DDP Join
// semantics, as Accelerate uses them). Inside a live join scope the engine, not the strategy,
// reduces the joined models' gradients, one round per reducing backward:
//   1. an allreduce of a vector [one slot per rank: 1 if it still trains | one slot per
//      joined model: 1 if this round reduces it], so every rank learns who trains and what
//      is reduced;
//   2. one allreduce (sum) of each reduced model's flattened gradients, divided by the
//      initial number of processes or by the ranks still training.
// A rank that leaves its loop waits in join_end and answers every round with zeros until a
// round finds no rank training; then the models take the weights of the last rank to finish
// (the lowest rank of the last round in which some had left), as torch's join hook does.
//
// Under a sharding strategy whose parameters stay whole at rest (zero stages 1 and 2) the
// strategy keeps reducing gradients into shards, and every rank steps its own shard before the
// parameters are all-gathered: a rank out of batches must take part in all of it. The ranks
// that train announce each reducing backward, each optimizer step (with its learning rates)
// and each clip_grad_norm_ (a collective over the shards) in a round first; a rank that left
// answers each by doing the same through the strategy: a backward of a zero loss (its
// gradient contribution is zeros; the reduce-scatter leaves it its shard of the others' sum),
// the same optimizer's step on its shard at the announced learning rates (then the all-gather),
// the same clipping. So every shard steps as in one process over the batches trained, and all
// ranks end with the same weights and optimizer state (torch's ZeroRedundancyOptimizer join
// hook also steps a joined rank's shard, with whatever gradient it holds). Stage 3 (and FSDP)
// gather the parameters before every forward, which a rank out of batches cannot know to
// answer (PyTorch's FSDP has no join either): refused.
#include <hasten/error.hpp>
#include <hasten/logging.hpp>
#include <hasten/torch_compat.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <limits>

#include "engine/autograd_graph.hpp"
#include "engine/engine_state.hpp"

namespace hasten::detail {

namespace {

std::vector<torch::Tensor> trained_params(ModelEntry& e) {
  std::vector<torch::Tensor> out;
  for (auto& p : e.module->parameters())
    if (p.requires_grad()) out.push_back(p);
  return out;
}

int64_t numel_of(const std::vector<torch::Tensor>& params) {
  int64_t n = 0;
  for (auto& p : params) n += p.numel();
  return n;
}

torch::ScalarType dtype_of(const std::vector<torch::Tensor>& params) {
  return params.empty() ? torch::kFloat : params.front().scalar_type();
}

std::vector<size_t> joined_models(const std::vector<ModelEntry>& models) {
  std::vector<size_t> out;
  for (size_t m = 0; m < models.size(); ++m)
    if (models[m].joined) out.push_back(m);
  return out;
}

// Round step 1's vector: who trains, and which joined models this round reduces.
torch::Tensor round_vector(int rank, int world, bool training, const std::vector<bool>& reduces) {
  auto v = torch::zeros({world + static_cast<int64_t>(reduces.size())}, torch::kLong);
  if (training) {
    v[rank] = 1;
    for (size_t k = 0; k < reduces.size(); ++k) v[world + static_cast<int64_t>(k)] = reduces[k] ? 1 : 0;
  }
  return v;
}

int64_t count_training(int world, const torch::Tensor& round, std::vector<int64_t>& ranks) {
  ranks.clear();
  auto a = round.accessor<int64_t, 1>();
  for (int64_t r = 0; r < world; ++r)
    if (a[r] > 0) ranks.push_back(r);
  return static_cast<int64_t>(ranks.size());
}

// The sharded round (doubles, reduced with MAX): [one slot per rank: it trains | kind:
// backward, step, clip | one slot per prepared model | one slot per optimizer | two
// arguments (clip's max_norm, norm_type) | the lr of every param group of every optimizer].
struct ShadowRound {
  int64_t world, models, optimizers, groups;
  int64_t kind(int k) const { return world + k; }
  int64_t model(size_t m) const { return world + 3 + static_cast<int64_t>(m); }
  int64_t optimizer(size_t o) const { return world + 3 + models + static_cast<int64_t>(o); }
  int64_t arg(int k) const { return world + 3 + models + optimizers + k; }
  int64_t lr(size_t g) const { return world + 5 + models + optimizers + static_cast<int64_t>(g); }
  int64_t size() const { return world + 5 + models + optimizers + groups; }
};
enum ShadowKind { kBackward = 0, kStep = 1, kClip = 2 };

// Every slot -inf until set, so that the maximum is the ranks' value even when it is not
// positive (a learning rate a schedule extrapolates below zero); flags are 1.
torch::Tensor empty_round(const ShadowRound& L) {
  return torch::full({L.size()}, -std::numeric_limits<double>::infinity(), torch::kDouble);
}

ShadowRound shadow_layout(int world, const std::vector<ModelEntry>& models,
                          const std::vector<OptimizerEntry>& optimizers) {
  int64_t groups = 0;
  for (auto& e : optimizers) groups += static_cast<int64_t>(e.optimizer->param_groups().size());
  return {world, static_cast<int64_t>(models.size()), static_cast<int64_t>(optimizers.size()), groups};
}

// The prepared models whose parameters a backward of `loss` reaches: under a sharding strategy
// the models whose gradients it reduces (with their sync on), all of whose units it reduces.
std::vector<bool> reached_models(const torch::Tensor& loss, const std::vector<ModelEntry>& models) {
  std::vector<bool> out(models.size(), false);
  if (!loss.grad_fn()) return out;
  const auto leaves = graph_leaves(loss.grad_fn().get());
  for (size_t m = 0; m < models.size(); ++m)
    for (const auto& p : models[m].module->parameters())
      if (leaves.count(p.unsafeGetTensorImpl())) {
        out[m] = true;
        break;
      }
  return out;
}

// The index of optimizer `o`'s first param group among all optimizers' groups.
size_t first_group(const std::vector<OptimizerEntry>& optimizers, size_t o) {
  size_t g = 0;
  for (size_t k = 0; k < o; ++k) g += optimizers[k].optimizer->param_groups().size();
  return g;
}

}  // namespace

void Engine::join_begin(const std::vector<size_t>& models, const JoinOptions& options) {
  Impl& s = *impl_;
  if (s.join.open)
    throw UsageError("join_uneven_inputs: a join scope is already live; join scopes do not nest");
  // Join's rounds reduce and broadcast over every process: tensor-parallel shards would be
  // summed with and overwritten by other ranks' shards.
  if (s.groups->layout().size("tp") > 1)
    throw UsageError("join_uneven_inputs: the device mesh has tp " + std::to_string(s.groups->layout().size("tp")) +
                     ", and joining uneven inputs under tensor parallelism is not supported yet (even_batches, the "
                     "default, gives every rank the same number of batches)");
  for (size_t m : models) s.models.at(m);  // every index names a prepared model
  const bool even = options.even_batches.value_or(s.config.even_batches);
  const bool sharded = s.strategy->has_state_dict();
  if (!even && s.process.world_size > 1 && sharded) {
    // A rank out of batches shadows backwards and optimizer steps (above); it cannot shadow
    // the parameter gathers before each forward of stage 3 / FSDP, whose parameters are
    // freed at rest (empty tensors between forwards).
    bool freed_at_rest = s.strategy->name() == "fsdp";
    for (size_t m : models)
      for (auto& p : s.models[m].module->parameters())
        freed_at_rest = freed_at_rest || (p.requires_grad() && p.numel() == 0);
    if (freed_at_rest)
      throw UsageError("join_uneven_inputs: with uneven inputs (even_batches false) a rank that ran out of batches "
                       "must answer the others' collectives, and strategy '" + s.strategy->name() +
                       "' shards the parameters at rest (ZeRO stage 3, FSDP): every forward gathers them, which a "
                       "rank out of batches cannot answer (PyTorch's FSDP has no join either). Use zero1, zero2 or "
                       "ddp, or keep even_batches true");
  }
  if (!even && s.process.world_size > 1 && !sharded) {
    for (size_t m : models)
      if (!s.models[m].module->buffers().empty())
        throw UsageError("join_uneven_inputs: model " + std::to_string(m) + " has buffers, which strategy '" +
                         s.strategy->name() +
                         "' synchronises after each optimizer step, a collective a rank that ran out of batches "
                         "cannot answer; join models without buffers, or keep even_batches true");
  }
  s.join.open = true;
  s.join.options = options;
  s.join.even_batches = options.even_batches;
  // As in Accelerate, the override reaches map-style loaders only: a stream's last round is
  // completed from its start (or dropped with drop_last) whatever even_batches says. Say so
  // rather than let the override look as if it applied.
  if (options.even_batches && s.process.world_size > 1)
    for (size_t i = 0; i < s.data.loaders.size(); ++i)
      if (s.data.loaders[i].stream) {
        get_logger()->warn(
            "join_uneven_inputs: overriding even_batches applies to loaders over map-style datasets only; "
            "loader {} reads a stream dataset and keeps its rounds as they are",
            i);
        break;
      }
  // Accelerate enables torch's Join only where inputs may be uneven.
  if (even || s.process.world_size == 1) return;
  s.join.live = true;
  s.join.sharded = sharded;
  s.join.last_partial.clear();
  for (auto& e : s.optimizers) e.join_zeroed = false;
  for (size_t m : models) {
    s.models[m].joined = true;
    s.apply_gradient_sync(s.models[m]);
  }
}

void Engine::Impl::join_reduce_after_backward() {
  if (!join.live || join.sharded) return;
  const std::vector<size_t> joined = joined_models(models);
  std::vector<bool> reduces;
  bool any = false;
  for (size_t m : joined) {
    reduces.push_back(wants_gradient_sync(models[m]));
    any = any || reduces.back();
  }
  if (!any) return;  // a local micro-batch: no round (the ranks that left wait for one)
  std::vector<int64_t> ranks;
  torch::Tensor round = round_vector(process.rank, process.world_size, true, reduces);
  allreduce_(round, HASTEN_REDUCE_SUM);
  const int64_t training = count_training(process.world_size, round, ranks);
  if (training < process.world_size) join.last_partial = ranks;
  const double divisor = join.options.divide_by_initial_world_size ? process.world_size : training;
  torch::NoGradGuard no_grad;
  for (size_t k = 0; k < joined.size(); ++k) {
    if (!reduces[k]) continue;
    auto params = trained_params(models[joined[k]]);
    if (params.empty()) continue;
    std::vector<torch::Tensor> pieces;
    for (auto& p : params)
      pieces.push_back(p.grad().defined() ? p.grad().reshape({-1}).to(dtype_of(params))
                                          : torch::zeros({p.numel()}, p.options().dtype(dtype_of(params))));
    torch::Tensor flat = torch::cat(pieces).contiguous();
    allreduce_(flat, HASTEN_REDUCE_SUM);
    flat.div_(divisor);
    int64_t offset = 0;
    for (auto& p : params) {
      auto part = flat.narrow(0, offset, p.numel()).view(p.sizes());
      if (p.grad().defined())
        p.mutable_grad().copy_(part);
      else
        p.mutable_grad() = part.to(p.scalar_type()).clone();
      offset += p.numel();
    }
  }
}

// ---- sharded: the rounds of the ranks that train ----------------------------------------

double Engine::Impl::join_round_before_backward(const torch::Tensor& loss) {
  if (!join.live || !join.sharded) return 1.0;
  const ShadowRound L = shadow_layout(process.world_size, models, optimizers);
  torch::Tensor v = empty_round(L);
  bool any = false;
  // Every model this backward reduces, joined or not: the strategy reduces each one the loss
  // reaches while its sync is on, and a rank out of batches must answer all of them.
  const std::vector<bool> reached = reached_models(loss, models);
  for (size_t m = 0; m < models.size(); ++m)
    if (reached[m] && models[m].sync_enabled) {
      v[L.model(m)] = 1;
      any = true;
    }
  if (!any) return 1.0;  // a local micro-batch: nothing reduced, nothing to shadow
  v[process.rank] = 1;
  v[L.kind(kBackward)] = 1;
  for (size_t o = 0; o < optimizers.size(); ++o) {
    if (optimizers[o].join_zeroed) v[L.optimizer(o)] = 1;
    optimizers[o].join_zeroed = false;
  }
  allreduce_(v, HASTEN_REDUCE_MAX);
  auto a = v.accessor<double, 1>();
  std::vector<int64_t> ranks;
  for (int64_t r = 0; r < L.world; ++r)
    if (a[r] > 0) ranks.push_back(r);
  const int64_t training = static_cast<int64_t>(ranks.size());
  if (training < L.world) join.last_partial = ranks;
  // The strategy divides by the initial number of processes; by the ranks training instead:
  if (join.options.divide_by_initial_world_size) return 1.0;
  return static_cast<double>(L.world) / static_cast<double>(training);
}

void Engine::Impl::join_round_before_step(size_t optimizer) {
  if (!join.live || !join.sharded) return;
  const ShadowRound L = shadow_layout(process.world_size, models, optimizers);
  torch::Tensor v = empty_round(L);
  v[process.rank] = 1;
  v[L.kind(kStep)] = 1;
  v[L.optimizer(optimizer)] = 1;
  // The learning rates the ranks training step with (their schedulers go on; a rank out of
  // batches stopped its own with its loop).
  const size_t g0 = first_group(optimizers, optimizer);
  auto& groups = optimizers[optimizer].optimizer->param_groups();
  for (size_t g = 0; g < groups.size(); ++g) v[L.lr(g0 + g)] = groups[g].options().get_lr();
  allreduce_(v, HASTEN_REDUCE_MAX);
}

void Engine::Impl::join_round_before_clip(size_t model, double max_norm, double norm_type) {
  if (!join.live || !join.sharded) return;
  const ShadowRound L = shadow_layout(process.world_size, models, optimizers);
  torch::Tensor v = empty_round(L);
  v[process.rank] = 1;
  v[L.kind(kClip)] = 1;
  v[L.model(model)] = 1;
  v[L.arg(0)] = max_norm;
  v[L.arg(1)] = norm_type;
  allreduce_(v, HASTEN_REDUCE_MAX);
}

// ---- sharded: a rank out of batches shadows the rounds until no rank trains ---------------

void Engine::Impl::join_shadow() {
  Impl& s = *this;
  const ShadowRound L = shadow_layout(process.world_size, models, optimizers);
  for (;;) {
    torch::Tensor v = empty_round(L);
    s.allreduce_(v, HASTEN_REDUCE_MAX);
    auto a = v.accessor<double, 1>();
    std::vector<int64_t> ranks;
    for (int64_t r = 0; r < L.world; ++r)
      if (a[r] > 0) ranks.push_back(r);
    if (ranks.empty()) break;
    s.join.last_partial = ranks;
    if (a[L.kind(kBackward)] > 0) {
      for (size_t o = 0; o < s.optimizers.size(); ++o)
        if (a[L.optimizer(o)] > 0) compat::zero_grad_in_place(*s.optimizers[o].optimizer);
      // A zero loss over the reduced models' parameters: their gradients are zeros, and the
      // strategy reduces them with the others' in its own order.
      torch::Tensor loss;
      for (size_t m = 0; m < s.models.size(); ++m) {
        if (!(a[L.model(m)] > 0)) continue;
        for (auto& p : trained_params(s.models[m])) {
          auto term = (p * 0).sum();
          loss = loss.defined() ? loss + term : term;
        }
      }
      if (!loss.defined()) continue;
      s.strategy->before_backward();
      loss.backward();
      s.strategy->after_backward();
    } else if (a[L.kind(kStep)] > 0) {
      for (size_t o = 0; o < s.optimizers.size(); ++o) {
        if (!(a[L.optimizer(o)] > 0)) continue;
        const size_t g0 = first_group(optimizers, o);
        auto& groups = s.optimizers[o].optimizer->param_groups();
        for (size_t g = 0; g < groups.size(); ++g) groups[g].options().set_lr(a[L.lr(g0 + g)]);
        s.step_optimizer(s.optimizers[o]);
      }
    } else if (a[L.kind(kClip)] > 0) {
      for (auto& e : optimizers) precision->unscale_gradients(*e.optimizer);  // as clip_grad_norm_
      for (size_t m = 0; m < s.models.size(); ++m)
        if (a[L.model(m)] > 0) s.strategy->clip_grad_norm(*s.models[m].module, a[L.arg(0)], a[L.arg(1)]);
    }
  }
}

void Engine::join_end() {
  Impl& s = *impl_;
  s.join.even_batches.reset();
  if (!s.join.live) {
    s.join.open = false;
    return;
  }
  if (s.join.sharded) {
    // Every shard stepped on every rank: the weights are already the same everywhere.
    s.join_shadow();
    join_abandon();
    return;
  }
  const std::vector<size_t> joined = joined_models(s.models);
  std::vector<int64_t> ranks;
  // Answer the ranks that still train until a round finds none.
  for (;;) {
    torch::Tensor round = round_vector(s.process.rank, s.process.world_size, false, std::vector<bool>(joined.size(), false));
    s.allreduce_(round, HASTEN_REDUCE_SUM);
    const int64_t training = count_training(s.process.world_size, round, ranks);
    if (training == 0) break;
    if (training < s.process.world_size) s.join.last_partial = ranks;
    auto a = round.accessor<int64_t, 1>();
    for (size_t k = 0; k < joined.size(); ++k) {
      if (a[s.process.world_size + static_cast<int64_t>(k)] == 0) continue;
      auto params = trained_params(s.models[joined[k]]);
      if (params.empty()) continue;
      auto zeros = torch::zeros({numel_of(params)}, params.front().options().dtype(dtype_of(params)).requires_grad(false));
      s.allreduce_(zeros, HASTEN_REDUCE_SUM);
    }
  }
  // The ranks that left early did not step: every rank takes the last finisher's weights.
  if (!s.join.last_partial.empty()) {
    const int from = static_cast<int>(*std::min_element(s.join.last_partial.begin(), s.join.last_partial.end()));
    torch::NoGradGuard no_grad;
    for (size_t m : joined)
      for (auto& p : s.models[m].module->parameters()) {
        torch::Tensor t = p.detach();
        broadcast_(t, from);
      }
  }
  join_abandon();
}

void Engine::join_abandon() noexcept {
  Impl& s = *impl_;
  s.join.even_batches.reset();
  s.join.open = false;
  s.join.live = false;
  s.join.sharded = false;
  s.join.last_partial.clear();
  for (auto& e : s.models) {
    if (!e.joined) continue;
    e.joined = false;
    try {
      s.apply_gradient_sync(e);
    } catch (const std::exception& ex) {
      get_logger("hasten", false)->error("{}", ex.what());
    }
  }
}

}  // namespace hasten::detail
