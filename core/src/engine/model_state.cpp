// What prepared models hold: full and sharded state dicts and the memory report, from the
// strategy when it shards, otherwise from the whole models every rank keeps.
#include <hasten/error.hpp>
#include <hasten/plugin_torch.hpp>
#include <hasten/plugin_optimizer_state.hpp>

#include <torch/nn/module.h>

#include <nlohmann/json.hpp>

#include <map>
#include <set>

#include "engine/engine_state.hpp"
#include "parallel/split_parameters.hpp"

namespace hasten::detail {

std::vector<std::pair<std::string, torch::Tensor>> Engine::state_dict(size_t model, int kind) {
  Impl& s = *impl_;
  ModelEntry& m = s.models.at(model);
  if (s.strategy->has_state_dict()) return s.strategy->state_dict(*m.module, kind);
  std::vector<std::pair<std::string, torch::Tensor>> out;
  // Tensor-parallel parts are gathered whole (every rank takes part), rank 0 keeps them.
  const SplitLayouts splits = split_layouts(*m.module);
  if (kind != 0 && !splits.empty())
    throw UsageError("get_sharded_state_dict: a tensor-parallel model's parts are not flat pieces of its tensors; "
                     "call get_state_dict, which gathers them whole");
  const bool main = s.process.is_main_process();
  if (kind == 0 && !main && splits.empty()) return out;
  torch::NoGradGuard no_grad;
  // Copies on the CPU, as the sharded strategies give them (and FSDP's offload_to_cpu): the
  // state dict of a GPU model does not hold a second copy of the model on its GPU.
  auto cpu_copy = [](const torch::Tensor& t) {
    return t.detach().to(torch::kCPU, t.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
  };
  for (auto& named : m.module->named_parameters()) {
    const auto split = splits.find(named.key());
    if (split != splits.end()) {
      torch::Tensor whole = gather_whole(*this, named.value(), split->second);
      if (main) out.emplace_back(named.key(), cpu_copy(whole));
      continue;
    }
    if (kind == 0 && !main) continue;
    torch::Tensor t = cpu_copy(named.value());
    if (kind == 0)
      out.emplace_back(named.key(), t);
    else
      out.emplace_back(named.key() + "@0:" + std::to_string(t.numel()), t.reshape(-1));
  }
  if (kind == 0 && main)
    for (auto& named : m.module->named_buffers()) out.emplace_back(named.key(), cpu_copy(named.value()));
  return out;
}

void Engine::check_unwrap(size_t model) const {
  const Impl& s = *impl_;
  const ModelEntry& m = s.models.at(model);
  if (!s.strategy->has_state_dict()) return;  // every rank holds the whole model
  for (auto& p : m.module->parameters())
    if (p.numel() == 0)
      throw UsageError("unwrap_model: strategy '" + s.strategy->name() +
                       "' keeps only shards of this model's parameters between forwards (the module's own are "
                       "empty now), so torch::save or a forward of the unwrapped module would see no weights; "
                       "for the weights call acc.get_state_dict(model) or acc.save_model(model, dir), for a module "
                       "with every parameter whole acc.full_model(model) (a copy, on every rank); model->member "
                       "reaches the module's other members");
}

void Engine::fill_full_copy(size_t model, torch::nn::Module& copy) {
  Impl& s = *impl_;
  if (!split_layouts(*s.models.at(model).module).empty())
    throw UsageError("full_model: the model is split over a tensor-parallel group, and its clone would be too (each "
                     "layer keeps its part); for its whole tensors call acc.get_state_dict(model) or "
                     "acc.save_model(model, dir)");
  auto full = state_dict(model, 0);  // rank 0's, one unit at a time
  if (s.process.world_size > 1) {
    // Rank 0 says what it has (names, dtypes, shapes); every rank then receives the tensors.
    nlohmann::json layout = nlohmann::json::array();
    for (auto& [name, t] : full)
      layout.push_back({{"name", name}, {"dtype", static_cast<int>(t.scalar_type())}, {"shape", t.sizes().vec()}});
    const auto received = nlohmann::json::parse(broadcast(layout.dump(), 0));
    if (!s.process.is_main_process()) {
      full.clear();
      for (auto& e : received)
        full.emplace_back(e.at("name").get<std::string>(),
                          torch::empty(e.at("shape").get<std::vector<int64_t>>(),
                                       torch::TensorOptions(static_cast<c10::ScalarType>(e.at("dtype").get<int>()))
                                           .device(s.device)));
    }
    for (auto& [name, t] : full) {
      t = t.contiguous();
      broadcast_(t, 0);
    }
  }
  std::map<std::string, torch::Tensor> by_name(full.begin(), full.end());
  torch::NoGradGuard no_grad;
  auto take = [&](const std::string& name, torch::Tensor& target, bool parameter) {
    auto it = by_name.find(name);
    if (it == by_name.end())
      throw UsageError("full_model: the copy has " + std::string(parameter ? "parameter" : "buffer") + " '" + name +
                       "' that the prepared model does not (clone() must build the same module)");
    if (parameter)
      target.set_data(it->second.to(target.device()));
    else
      target.set_data(it->second.to(target.device()).clone());
    by_name.erase(it);
  };
  for (auto& named : copy.named_parameters()) take(named.key(), named.value(), true);
  for (auto& named : copy.named_buffers()) take(named.key(), named.value(), false);
  if (!by_name.empty())
    throw UsageError("full_model: the copy lacks '" + by_name.begin()->first +
                     "' of the prepared model (clone() must build the same module)");
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
