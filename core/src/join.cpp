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
#include <hasten/error.hpp>
#include <hasten/logging.hpp>

#include <torch/torch.h>

#include <algorithm>

#include "engine_state.hpp"

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

}  // namespace

void Engine::join_begin(const std::vector<size_t>& models, const JoinOptions& options) {
  Impl& s = *impl_;
  if (s.join_open)
    throw UsageError("join_uneven_inputs: a join scope is already live; join scopes do not nest");
  for (size_t m : models) s.models.at(m);  // every index names a prepared model
  const bool even = options.even_batches.value_or(s.config.even_batches);
  if (!even && s.process.world_size > 1) {
    if (s.strategy->has_state_dict())
      throw UsageError("join_uneven_inputs: with uneven inputs (even_batches false) a rank that ran out of "
                       "batches answers the others' gradient reductions, which needs gradients that live in the "
                       "parameters; strategy '" + s.strategy->name() +
                       "' reduces them into shards. Use strategy ddp, or keep even_batches true");
    for (size_t m : models)
      if (!s.models[m].module->buffers().empty())
        throw UsageError("join_uneven_inputs: model " + std::to_string(m) + " has buffers, which strategy '" +
                         s.strategy->name() +
                         "' synchronises after each optimizer step, a collective a rank that ran out of batches "
                         "cannot answer; join models without buffers, or keep even_batches true");
  }
  s.join_open = true;
  s.join_options = options;
  s.join_even_batches = options.even_batches;
  // As in Accelerate, the override reaches map-style loaders only: a stream's last round is
  // completed from its start (or dropped with drop_last) whatever even_batches says. Say so
  // rather than let the override look as if it applied.
  if (options.even_batches && s.process.world_size > 1)
    for (size_t i = 0; i < s.loaders.size(); ++i)
      if (s.loaders[i].stream) {
        get_logger()->warn(
            "join_uneven_inputs: overriding even_batches applies to loaders over map-style datasets only; "
            "loader {} reads a stream dataset and keeps its rounds as they are",
            i);
        break;
      }
  // Accelerate enables torch's Join only where inputs may be uneven.
  if (even || s.process.world_size == 1) return;
  s.join_live = true;
  s.join_last_partial.clear();
  for (size_t m : models) {
    s.models[m].joined = true;
    s.apply_gradient_sync(s.models[m]);
  }
}

void Engine::Impl::join_reduce_after_backward() {
  if (!join_live) return;
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
  if (training < process.world_size) join_last_partial = ranks;
  const double divisor = join_options.divide_by_initial_world_size ? process.world_size : training;
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

void Engine::join_end() {
  Impl& s = *impl_;
  s.join_even_batches.reset();
  if (!s.join_live) {
    s.join_open = false;
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
    if (training < s.process.world_size) s.join_last_partial = ranks;
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
  if (!s.join_last_partial.empty()) {
    const int from = static_cast<int>(*std::min_element(s.join_last_partial.begin(), s.join_last_partial.end()));
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
  s.join_even_batches.reset();
  s.join_open = false;
  s.join_live = false;
  s.join_last_partial.clear();
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
