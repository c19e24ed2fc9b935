// Models built without their full weights (config key sharded_init; DeepSpeed's
// zero3_init_flag and FSDP's fsdp_cpu_ram_efficient_loading set it). From the Accelerator's
// construction until it prepares its first model, every hasten::Unit constructed on its thread
// is handed to the strategy as soon as its constructor returns (ABI 1.8 unit_built), which
// may keep only this rank's shard of the parameters the unit owns. A unit's constructor runs
// the module's own initialisers first, so the values, and the random numbers drawn, are
// those of the model built whole.
#include <hasten/logging.hpp>

#include <torch/nn/module.h>

#include <algorithm>

#include "engine/engine_state.hpp"
#include "offload/unit_stream.hpp"

namespace hasten::detail {

namespace {
// The Accelerator whose window is open on this thread (one at a time: the first one wins).
thread_local const Engine* t_building = nullptr;
}  // namespace

void Engine::Impl::start_sharded_build(Engine& self) {
  if (!config.sharded_init) return;
  if (!strategy->has_unit_built()) {
    get_logger()->warn("sharded_init: strategy '{}' does not build units sharded (ABI 1.8 unit_built); models are "
                       "built whole",
                       strategy->name());
    return;
  }
  if (t_building == nullptr) t_building = &self;
}

void Engine::Impl::stop_sharded_build(const Engine& self) {
  if (t_building == &self) t_building = nullptr;
}

void unit_built(torch::nn::Module& unit) {
  const Engine* engine = t_building;
  if (engine == nullptr) {
    if (empty_weights_active()) empty_unit_weights(unit);  // big-model inference (EmptyWeights)
    return;
  }
  Engine::Impl& s = *engine->impl_;
  // The unit's subtree as prepare_model sees a model: the unit first, then its nested units
  // (each built, and handed over, before it).
  std::vector<hasten_module*> units{reinterpret_cast<hasten_module*>(&unit)};
  for (auto& m : unit.modules(/*include_self=*/false))
    if (dynamic_cast<UnitBase*>(m.get()) != nullptr) units.push_back(reinterpret_cast<hasten_module*>(m.get()));
  hasten_model_info info{};
  info.struct_size = sizeof(info);
  info.abi_version = HASTEN_ABI_VERSION;
  info.index = static_cast<uint32_t>(s.models.size());
  info.device = s.dl_device;
  info.train = 1;
  info.units = units.data();
  info.n_units = static_cast<uint32_t>(units.size());
  s.strategy->unit_built(unit, info);
  s.built_sharded.push_back(&unit);
}

}  // namespace hasten::detail
