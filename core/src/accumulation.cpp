// The gradient accumulation state machine: which micro-batch synchronises, how long the
// current window is, and suspending the strategy's gradient sync in between.
#include <hasten/logging.hpp>

#include <algorithm>

#include "engine_state.hpp"

namespace hasten::detail {

void Engine::begin_accumulate(const std::vector<size_t>& models) {
  Impl& s = *impl_;
  const int64_t n = s.config.gradient_accumulation_steps;
  const ActiveLoader* loader = s.innermost();
  if (s.end_of_dataloader()) {
    // The loader's last batch always synchronises and closes the window.
    if (s.accum_step % n == 0) s.window = 1;
    s.accum_step = 0;
    s.sync = true;
  } else {
    if (s.accum_step % n == 0) {
      // A new window: as long as the micro-batches left in the loader allow, so that a short
      // last window is a mean over the batches it really has.
      const int64_t left = loader != nullptr && loader->batch >= 0 ? loader->num_batches - loader->batch : n;
      s.window = std::max<int64_t>(1, std::min(n, left));
    }
    ++s.accum_step;
    s.sync = s.accum_step % n == 0;
  }
  ++s.accumulate_depth;
  s.backward_in_scope = false;
  s.scope_ended_unused = false;
  for (size_t m : models) {
    ModelEntry& e = s.models.at(m);
    if (e.sync_enabled != s.sync) {
      s.strategy->set_gradient_sync(*e.module, s.sync);
      e.sync_enabled = s.sync;
    }
  }
}

void Engine::end_accumulate(const std::vector<size_t>& models) noexcept {
  Impl& s = *impl_;
  --s.accumulate_depth;
  // `acc.accumulate(model);` as a statement ends the scope at once: the backward that
  // follows would neither be divided nor keep its gradients local. backward() says so.
  s.scope_ended_unused = !s.backward_in_scope;
  for (size_t m : models) {
    try {
      ModelEntry& e = s.models.at(m);
      if (!e.sync_enabled) {
        s.strategy->set_gradient_sync(*e.module, true);
        e.sync_enabled = true;
      }
    } catch (const std::exception& ex) {
      get_logger("hasten", false)->error("{}", ex.what());
    }
  }
}

bool Engine::sync_gradients() const { return impl_->sync; }
int Engine::gradient_accumulation_steps() const { return impl_->config.gradient_accumulation_steps; }

}  // namespace hasten::detail
