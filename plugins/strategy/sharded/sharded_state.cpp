// The sharded strategies' state in and out: full and sharded state dicts, loading full
// tensors into the shards, and the optimizer state by parameter name (checkpoints, any number
// of ranks).
#include "sharded_strategy.hpp"

#include <algorithm>
#include <map>
#include <set>

namespace hasten::sharded {

using sdk::Error;

namespace {

// A copy on the CPU (a clone where the tensor already is there).
torch::Tensor cpu_copy(const torch::Tensor& t) {
  return t.detach().to(torch::kCPU, t.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
}

}  // namespace

void ShardedStrategy::state_dict(torch::nn::Module& module, int32_t kind, const Emit& emit) {
  Model& m = find(module);
  torch::NoGradGuard no_grad;
  // HSDP: the full tensors come from world rank 0 alone (shard rank 0 of replica 0). Pieces
  // (below, and optimizer_state) come from every rank, replicas included: each rank then reads
  // back its own file in place, and a resharding load finds every piece whichever replicas it
  // reads.
  const bool writes = replica_ == 0;
  if (kind == 1) {
    // This rank's pieces of every parameter, named "<name>@<offset>:<length>".
    for (auto& u : m.units) {
      if (u.params.empty()) continue;
      const torch::Tensor source = options_.stage >= 1 ? u.master : u.flat.narrow(0, rank_ * u.shard, u.shard);
      for (size_t i = 0; i < u.params.size(); ++i) {
        const int64_t begin = u.offsets[i], end = begin + c10::multiply_integers(u.shapes[i]);
        const int64_t lo = std::max<int64_t>(begin, rank_ * u.shard), hi = std::min<int64_t>(end, (rank_ + 1) * u.shard);
        if (lo >= hi) continue;
        torch::Tensor piece = source.narrow(0, lo - rank_ * u.shard, hi - lo).clone();
        emit(u.names[i] + "@" + std::to_string(lo - begin) + ":" + std::to_string(hi - lo), piece);
      }
    }
    return;
  }
  // The full tensors on rank 0, one unit at a time: no rank holds more than one unit beyond
  // its shards, and rank 0 copies each to the CPU (FSDP's offload_to_cpu, rank0_only), so a
  // model larger than one GPU can be saved.
  for (auto& u : m.units) {
    if (u.params.empty()) continue;
    const bool gathered_here = !u.params_live;
    gather_now(u);
    if (rank_ == 0 && writes)
      for (size_t i = 0; i < u.params.size(); ++i) {
        torch::Tensor copy = cpu_copy(u.params[i]);
        emit(u.names[i], copy);
      }
    if (gathered_here) free_params(u);
  }
  if (rank_ == 0 && writes) {
    std::set<const void*> sharded;
    for (auto& u : m.units)
      for (auto& p : u.params) sharded.insert(p.unsafeGetTensorImpl());
    for (auto& named : module.named_parameters())
      if (!sharded.count(named.value().unsafeGetTensorImpl())) {
        torch::Tensor copy = cpu_copy(named.value());
        emit(named.key(), copy);
      }
    for (auto& named : module.named_buffers()) {
      torch::Tensor copy = cpu_copy(named.value());
      emit(named.key(), copy);
    }
  }
}

void ShardedStrategy::load_state_dict(torch::nn::Module& module, const NamedTensorRefs& tensors) {
  Model& m = find(module);
  std::map<std::string, const at::Tensor*> by_name;
  for (auto& [name, value] : tensors) by_name[name] = value;
  auto take = [&](const std::string& name, at::IntArrayRef shape) -> at::Tensor {
    auto it = by_name.find(name);
    if (it == by_name.end())
      throw Error(HASTEN_ERR_INVALID_ARGUMENT, options_.label + ": the state dict has no '" + name + "'");
    if (it->second->sizes() != shape)
      throw Error(HASTEN_ERR_INVALID_ARGUMENT, options_.label + ": '" + name + "' has shape " +
                                                   c10::str(it->second->sizes()) + ", the model's is " + c10::str(shape));
    const at::Tensor t = *it->second;
    by_name.erase(it);
    return t;
  };
  torch::NoGradGuard no_grad;
  // Sharded parameters: this rank's slice into the master shard (whatever the number of
  // ranks that saved the full tensors), the full tensor into the flat buffer while it lives.
  for (auto& u : m.units) {
    for (size_t i = 0; i < u.params.size(); ++i) {
      const at::Tensor full = take(u.names[i], u.shapes[i]).reshape(-1);
      const int64_t begin = u.offsets[i], end = begin + full.numel();
      if (u.params_live) u.flat.narrow(0, begin, full.numel()).copy_(full);
      if (options_.stage >= 1) {
        const int64_t lo = std::max<int64_t>(begin, rank_ * u.shard), hi = std::min<int64_t>(end, (rank_ + 1) * u.shard);
        if (lo < hi) u.master.narrow(0, lo - rank_ * u.shard, hi - lo).copy_(full.narrow(0, lo - begin, hi - lo));
      }
    }
  }
  std::set<const void*> sharded;
  for (auto& u : m.units)
    for (auto& p : u.params) sharded.insert(p.unsafeGetTensorImpl());
  for (auto& named : module.named_parameters())
    if (!sharded.count(named.value().unsafeGetTensorImpl()))
      named.value().copy_(take(named.key(), named.value().sizes()));
  for (auto& named : module.named_buffers()) named.value().copy_(take(named.key(), named.value().sizes()));
  if (!by_name.empty())
    throw Error(HASTEN_ERR_INVALID_ARGUMENT,
                options_.label + ": the state dict has '" + by_name.begin()->first + "', which the model does not");
}

void ShardedStrategy::load_state_dict_ranges(torch::nn::Module& module, const ReadRange& read) {
  Model& m = find(module);
  torch::NoGradGuard no_grad;
  // As load_state_dict, but each rank asks only for what it keeps: its slice of every sharded
  // parameter into the master shard (the whole parameter into the flat buffer while it lives),
  // and the parameters and buffers nothing shards.
  for (auto& u : m.units) {
    for (size_t i = 0; i < u.params.size(); ++i) {
      const int64_t numel = c10::multiply_integers(u.shapes[i]), begin = u.offsets[i], end = begin + numel;
      at::Tensor live;
      if (u.params_live) {
        live = u.flat.narrow(0, begin, numel);
        read(u.names[i], u.shapes[i], 0, live);
      }
      if (options_.stage >= 1) {
        const int64_t lo = std::max<int64_t>(begin, rank_ * u.shard), hi = std::min<int64_t>(end, (rank_ + 1) * u.shard);
        if (lo >= hi) continue;
        at::Tensor shard = u.master.narrow(0, lo - rank_ * u.shard, hi - lo);
        if (live.defined() && live.scalar_type() == shard.scalar_type())
          shard.copy_(live.narrow(0, lo - begin, hi - lo));  // the same bytes, already read
        else
          read(u.names[i], u.shapes[i], lo - begin, shard);  // another dtype: from the file's values
      }
    }
  }
  std::set<const void*> sharded;
  for (auto& u : m.units)
    for (auto& p : u.params) sharded.insert(p.unsafeGetTensorImpl());
  for (auto& named : module.named_parameters())
    if (!sharded.count(named.value().unsafeGetTensorImpl())) read(named.key(), named.value().sizes(), 0, named.value());
  for (auto& named : module.named_buffers()) read(named.key(), named.value().sizes(), 0, named.value());
}

void ShardedStrategy::optimizer_state(torch::optim::Optimizer& optimizer, torch::nn::Module& module, const Emit& emit) {
  Model& m = find(module);
  for (uint32_t k = 0; k < m.units.size(); ++k) {
    Unit& u = m.units[k];
    for (size_t i = 0; i < u.params.size(); ++i) {
      const int64_t begin = u.offsets[i], end = begin + c10::multiply_integers(u.shapes[i]);
      torch::Tensor target;
      int64_t lo = begin;
      if (options_.stage == 0) {
        if (rank_ != 0) continue;  // every rank steps the same full parameters
        target = u.params[i];
      } else {
        auto it = view_of_.find({&optimizer, &m, k, i});
        if (it == view_of_.end()) continue;  // not this optimizer's, or wholly on other ranks
        target = it->second;
        lo = std::max<int64_t>(begin, rank_ * u.shard);
      }
      for (auto& [key, value] : sdk::param_state(optimizer, target)) {
        at::Tensor v = value.detach();
        if (v.dim() == 0)
          emit(u.names[i] + "/" + key, v);
        else {
          v = v.reshape(-1);
          emit(u.names[i] + "/" + key + "@" + std::to_string(lo - begin) + ":" + std::to_string(v.numel()), v);
        }
      }
      (void)end;
    }
  }
}

void ShardedStrategy::load_optimizer_state(torch::optim::Optimizer& optimizer, torch::nn::Module& module,
                                           const NamedTensorRefs& tensors) {
  Model& m = find(module);
  // "<param>/<key>" -> full tensor (1-D, or 0-d scalars).
  std::map<std::string, std::map<std::string, const at::Tensor*>> by_param;
  for (auto& [name, value] : tensors) {
    const auto slash = name.rfind('/');
    if (slash == std::string::npos)
      throw Error(HASTEN_ERR_INVALID_ARGUMENT, options_.label + ": optimizer state name '" + name + "' has no '/<key>'");
    by_param[name.substr(0, slash)][name.substr(slash + 1)] = value;
  }
  for (uint32_t k = 0; k < m.units.size(); ++k) {
    Unit& u = m.units[k];
    for (size_t i = 0; i < u.params.size(); ++i) {
      auto found = by_param.find(u.names[i]);
      if (found == by_param.end()) continue;  // no state yet (never stepped)
      const int64_t begin = u.offsets[i], numel = c10::multiply_integers(u.shapes[i]);
      torch::Tensor target;
      int64_t lo = begin, length = numel;
      if (options_.stage == 0) {
        target = u.params[i];
      } else {
        auto it = view_of_.find({&optimizer, &m, k, i});
        if (it == view_of_.end()) continue;
        target = it->second;
        lo = std::max<int64_t>(begin, rank_ * u.shard);
        length = target.numel();
      }
      std::map<std::string, at::Tensor> state;
      for (auto& [key, full] : found->second) {
        if (full->dim() == 0) {
          state[key] = *full;
          continue;
        }
        if (full->numel() != numel)
          throw Error(HASTEN_ERR_INVALID_ARGUMENT, options_.label + ": optimizer state '" + u.names[i] + "/" + key +
                                                       "' has " + std::to_string(full->numel()) + " elements, the parameter " +
                                                       std::to_string(numel));
        state[key] = full->reshape(-1).narrow(0, lo - begin, length);
      }
      sdk::set_param_state(optimizer, target, state);
    }
  }
}

}  // namespace hasten::sharded
