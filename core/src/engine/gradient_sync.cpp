// Whether a backward reduces a prepared model's gradients: the accumulate scope's decision,
// no_sync and trigger_sync_in_backward scopes, and the no_sync state of the model's last call
// (DDP decides at forward: a loss computed under no_sync stays local when its backward runs
// after the scope). The strategy is told only when the answer changes.
#include <hasten/logging.hpp>

#include "engine/engine_state.hpp"

namespace hasten::detail {

bool Engine::Impl::wants_gradient_sync(const ModelEntry& e) const {
  if (e.trigger_depth > 0) return true;
  return !e.accumulate_local && e.no_sync_depth == 0 && !e.called_local;
}

void Engine::Impl::apply_gradient_sync(ModelEntry& e) {
  // Under a live join scope the engine reduces a joined model's gradients itself (join.cpp),
  // except under a sharding strategy, which keeps reducing them (the ranks out of batches
  // shadow it).
  const bool want = wants_gradient_sync(e) && !(e.joined && !join.sharded);
  if (want == e.sync_enabled) return;
  strategy->set_gradient_sync(*e.module, want);
  e.sync_enabled = want;
}

void Engine::no_sync_begin(const std::vector<size_t>& models) {
  for (size_t m : models) {
    ModelEntry& e = impl_->models.at(m);
    ++e.no_sync_depth;
    impl_->apply_gradient_sync(e);
  }
}

void Engine::no_sync_end(const std::vector<size_t>& models) noexcept {
  for (size_t m : models) {
    try {
      ModelEntry& e = impl_->models.at(m);
      --e.no_sync_depth;
      impl_->apply_gradient_sync(e);
    } catch (const std::exception& ex) {
      get_logger("hasten", false)->error("{}", ex.what());
    }
  }
}

void Engine::trigger_sync_begin(const std::vector<size_t>& models) {
  for (size_t m : models) {
    ModelEntry& e = impl_->models.at(m);
    ++e.trigger_depth;
    impl_->apply_gradient_sync(e);
  }
}

void Engine::trigger_sync_end(const std::vector<size_t>& models) noexcept {
  for (size_t m : models) {
    try {
      ModelEntry& e = impl_->models.at(m);
      --e.trigger_depth;
      impl_->apply_gradient_sync(e);
    } catch (const std::exception& ex) {
      get_logger("hasten", false)->error("{}", ex.what());
    }
  }
}

void Engine::model_called(size_t model) {
  ModelEntry& e = impl_->models.at(model);
  e.called_local = e.no_sync_depth > 0;
  impl_->apply_gradient_sync(e);
}

}  // namespace hasten::detail
