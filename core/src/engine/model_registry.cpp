// Prepared models: registration with the strategy, the hasten::Unit modules attached to them,
// and finding a model's index again.
#include <hasten/error.hpp>

#include <hasten/logging.hpp>

#include <torch/nn/module.h>

#include <algorithm>

#include "engine/engine_state.hpp"

namespace hasten::detail {

namespace {
// Marks the outermost units below `m` (and `m` itself when it is one) whose forward can be
// checkpointed; returns how many. A unit inside a marked one runs inside its recompute.
size_t mark_checkpointed(torch::nn::Module& m, bool include_self) {
  if (include_self)
    if (auto* u = dynamic_cast<UnitBase*>(&m); u != nullptr && u->hasten_checkpointable()) {
      u->hasten_set_checkpointed(true);
      return 1;
    }
  size_t marked = 0;
  for (auto& child : m.children()) marked += mark_checkpointed(*child, true);
  return marked;
}
}  // namespace

size_t Engine::add_model(std::shared_ptr<torch::nn::Module> module) {
  Impl& s = *impl_;
  if (!module) throw UsageError("prepare: the model is null");
  Impl::stop_sharded_build(*this);  // models built from here on are built whole
  // Tensor parallelism needs a strategy that keeps each parameter's replicas apart from its
  // tensor-parallel shards: one built against ABI 1.11 or later reads the mesh (ddp averages over
  // the `dp` group; zero and fsdp refuse tp themselves). An older one would average shards of
  // different parameters across the tp group: refused here rather than trained wrong.
  {
    const auto& layout = s.groups->layout();
    const PluginInfo& strategy = s.strategy->info();
    if ((layout.size("tp") > 1 || layout.size("cp") > 1) && strategy.abi_major == 1 && strategy.abi_minor < 11)
      throw UsageError("prepare: parallelism_config makes a device mesh of " + layout.describe() + ", and strategy '" +
                       strategy.name + "' was built against plugin ABI 1." + std::to_string(strategy.abi_minor) +
                       ", before process groups (1.11): it would average tensor-parallel shards as replicas; "
                       "use a strategy built against 1.11 or later (ddp) or set parallelism_config_tp_size to 1");
  }
  const size_t index = s.models.size();
  hasten_model_info info{};
  info.struct_size = sizeof(info);
  info.abi_version = HASTEN_ABI_VERSION;
  info.index = static_cast<uint32_t>(index);
  info.device = s.dl_device;
  bool train = false;
  for (auto& p : module->parameters()) train = train || p.requires_grad();
  info.train = train ? 1 : 0;
  // Units: the model itself first, then every nested hasten::Unit in modules() order.
  ModelEntry entry;
  entry.module = module;
  std::vector<hasten_module*> units{reinterpret_cast<hasten_module*>(module.get())};
  entry.root_is_unit = dynamic_cast<UnitBase*>(module.get()) != nullptr;
  for (auto& m : module->modules(/*include_self=*/false)) {
    if (auto* u = dynamic_cast<UnitBase*>(m.get())) {
      if (u->engine_ != nullptr && u->engine_ != this)
        throw UsageError("prepare: a hasten::Unit of this model is already prepared by another Accelerator");
      if (u->stream_ != nullptr || u->device_.has_value())
        throw UsageError("prepare: a hasten::Unit of this model is dispatched by a device map "
                         "(load_checkpoint_and_dispatch, for inference); prepare a model loaded whole "
                         "(hasten::load_weights) to train it");
      entry.units.push_back(u);
      units.push_back(reinterpret_cast<hasten_module*>(m.get()));
    }
  }
  info.units = units.data();
  info.n_units = static_cast<uint32_t>(units.size());
  if (s.config.sharded_init && train && s.strategy->has_unit_built() &&
      std::none_of(units.begin(), units.end(), [&](hasten_module* u) {
        return std::find(s.built_sharded.begin(), s.built_sharded.end(),
                         reinterpret_cast<const torch::nn::Module*>(u)) != s.built_sharded.end();
      }))
    get_logger()->warn("sharded_init: model {} ('{}') was built whole: {}", index, module->name(),
                       units.size() == 1 ? "it declares no hasten::Unit to build sharded"
                                         : "build it after the Accelerator, on its thread, before the first prepare");
  s.strategy->prepare_model(*module, info);
  if (s.unit_events) {
    uint32_t k = 1;
    for (UnitBase* u : entry.units) {
      u->engine_ = this;
      u->model_ = index;
      u->unit_ = k++;
    }
    if (auto* root = dynamic_cast<UnitBase*>(module.get())) {
      root->engine_ = this;
      root->model_ = index;
      root->unit_ = 0;
    }
  }
  // Config key activation_checkpointing: every outermost unit below the model's root.
  if (s.config.activation_checkpointing && mark_checkpointed(*module, false) == 0)
    throw UsageError("prepare: activation_checkpointing is on, and model " + std::to_string(index) + " ('" +
                     module->name() + "') holds no hasten::Unit whose forward returns one tensor to recompute; declare "
                     "its blocks as units (hasten::Unit<Block>) or set activation_checkpointing false");
  s.models.push_back(std::move(entry));
  return index;
}


size_t Engine::checkpoint_activations(torch::nn::Module& module) {
  const size_t marked = mark_checkpointed(module, true);
  if (marked == 0)
    throw UsageError("checkpoint_activations: '" + module.name() +
                     "' holds no hasten::Unit whose forward returns one tensor (and takes tensors, numbers or "
                     "strings); declare the blocks to recompute as units (hasten::Unit<Block>)");
  return marked;
}

std::optional<size_t> Engine::find_model(const torch::nn::Module* module) const {
  for (size_t i = 0; i < impl_->models.size(); ++i)
    if (impl_->models[i].module.get() == module) return i;
  return std::nullopt;
}

}  // namespace hasten::detail

namespace hasten {

UnitBase::~UnitBase() = default;

}  // namespace hasten
