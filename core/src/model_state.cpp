// What prepared models hold: full and sharded state dicts and the memory report, from the
// strategy when it shards, otherwise from the whole models every rank keeps.
#define HASTEN_PLUGIN_TORCH_TIER 1  // sdk::optimizer_state_bytes
#include <hasten/plugin.hpp>

#include <torch/nn/module.h>

#include <set>

#include "engine_state.hpp"

namespace hasten::detail {

std::vector<std::pair<std::string, torch::Tensor>> Engine::state_dict(size_t model, int kind) {
  Impl& s = *impl_;
  ModelEntry& m = s.models.at(model);
  if (s.strategy->has_state_dict()) return s.strategy->state_dict(*m.module, kind);
  std::vector<std::pair<std::string, torch::Tensor>> out;
  if (kind == 0 && !s.process.is_main_process()) return out;
  torch::NoGradGuard no_grad;
  for (auto& named : m.module->named_parameters()) {
    torch::Tensor t = named.value().detach().clone();
    if (kind == 0)
      out.emplace_back(named.key(), t);
    else
      out.emplace_back(named.key() + "@0:" + std::to_string(t.numel()), t.reshape(-1));
  }
  if (kind == 0)
    for (auto& named : m.module->named_buffers()) out.emplace_back(named.key(), named.value().detach().clone());
  return out;
}

MemoryReport Engine::memory_report() {
  Impl& s = *impl_;
  MemoryReport r;
  if (s.strategy->has_memory_report()) {
    const hasten_memory_report m = s.strategy->memory_report();
    r.params = m.params, r.param_shards = m.param_shards, r.grads = m.grads, r.optimizer = m.optimizer;
    r.peak_params = m.peak_params, r.peak_param_shards = m.peak_param_shards;
    r.peak_grads = m.peak_grads, r.peak_optimizer = m.peak_optimizer;
    return r;
  }
  // Unsharded: every rank holds the whole models, their gradients and optimizer states.
  std::set<const void*> seen;
  for (auto& m : s.models) {
    for (auto& p : m.module->parameters()) {
      if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
      r.params += static_cast<uint64_t>(p.numel()) * p.element_size();
      if (p.grad().defined()) r.grads += static_cast<uint64_t>(p.grad().numel()) * p.grad().element_size();
    }
  }
  for (auto& o : s.optimizers) r.optimizer += sdk::optimizer_state_bytes(*o.optimizer);
  r.peak_params = r.params, r.peak_grads = r.grads, r.peak_optimizer = r.optimizer;
  return r;
}

}  // namespace hasten::detail
