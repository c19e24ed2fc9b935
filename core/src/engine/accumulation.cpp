// The gradient accumulation state machine: which micro-batch synchronises, how long the
// current window is, and suspending the strategy's gradient sync in between.
#include <hasten/logging.hpp>

#include <algorithm>

#include "engine/engine_state.hpp"

namespace hasten::detail {

void Engine::begin_accumulate(const std::vector<size_t>& models) {
  Impl& s = *impl_;
  const int64_t n = s.config.gradient_accumulation_steps;
  const ActiveLoader* loader = s.data.innermost();
  if (s.config.sync_with_dataloader && s.data.end_of_dataloader()) {
    // The loader's last batch synchronises and closes the window (sync_with_dataloader).
    if (s.accumulation.step % n == 0) s.accumulation.window = 1;
    s.accumulation.step = 0;
    s.accumulation.sync = true;
  } else {
    if (s.accumulation.step % n == 0) {
      // A new window: as long as the micro-batches left in the loader allow, so that a short
      // last window is a mean over the batches it really has.
      const int64_t left = loader != nullptr && loader->batch >= 0 && s.config.sync_with_dataloader
                               ? loader->num_batches - loader->batch
                               : n;
      s.accumulation.window = std::max<int64_t>(1, std::min(n, left));
    }
    ++s.accumulation.step;
    s.accumulation.sync = s.accumulation.step % n == 0;
  }
  ++s.accumulation.depth;
  s.accumulation.backward_in_scope = false;
  s.accumulation.scope_ended_unused = false;
  // A micro-batch that does not step keeps its gradients local, unless sync_each_batch
  // reduces them every time (Accelerate: only where there is more than one process).
  const bool local = !s.accumulation.sync && !(s.config.sync_each_batch && s.process.world_size > 1);
  for (size_t m : models) {
    ModelEntry& e = s.models.at(m);
    e.accumulate_local = local;
    s.apply_gradient_sync(e);
  }
}

void Engine::end_accumulate(const std::vector<size_t>& models) noexcept {
  Impl& s = *impl_;
  --s.accumulation.depth;
  // `acc.accumulate(model);` as a statement ends the scope at once: the backward that
  // follows would neither be divided nor keep its gradients local. backward() says so.
  s.accumulation.scope_ended_unused = !s.accumulation.backward_in_scope;
  for (size_t m : models) {
    try {
      ModelEntry& e = s.models.at(m);
      e.accumulate_local = false;
      s.apply_gradient_sync(e);
    } catch (const std::exception& ex) {
      get_logger("hasten", false)->error("{}", ex.what());
    }
  }
}

bool Engine::sync_gradients() const { return impl_->accumulation.sync; }
int Engine::gradient_accumulation_steps() const { return impl_->config.gradient_accumulation_steps; }

GradientState Engine::gradient_state() const {
  const Impl& s = *impl_;
  GradientState g;
  g.sync_gradients = s.accumulation.sync;
  g.step = s.accumulation.step;
  g.num_steps = s.config.gradient_accumulation_steps;
  g.sync_each_batch = s.config.sync_each_batch;
  g.sync_with_dataloader = s.config.sync_with_dataloader;
  g.adjust_scheduler = s.config.adjust_scheduler && s.config.scheduler_steps_per_process;
  if (const ActiveLoader* a = s.data.innermost()) {
    g.in_dataloader = true;
    g.active_dataloader = static_cast<int64_t>(a->id);
    g.end_of_dataloader = s.data.end_of_dataloader();
    // Accelerate's remainder: the dataset size modulo the global batch, unless drop_last.
    const ShardSpec& spec = s.data.loaders.at(a->id).spec;
    if (!spec.options.drop_last) {
      const int64_t global = spec.split_batches ? spec.options.batch_size : spec.options.batch_size * spec.world_size;
      g.remainder = global > 0 ? spec.dataset_size % global : -1;
    }
  }
  return g;
}

}  // namespace hasten::detail
