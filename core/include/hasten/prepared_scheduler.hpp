// hasten::PreparedScheduler: a learning-rate scheduler after Accelerator::prepare.
#pragma once

#include <hasten/detail/engine.hpp>

#include <memory>
#include <utility>

namespace hasten {

// A learning-rate scheduler after prepare: step() advances the schedule once per real
// optimizer step (not on accumulation micro-batches, not when the step was skipped), unless
// step_scheduler_with_optimizer is false; num_processes times per optimizer step with
// scheduler_steps_per_process (unless split_batches), as Accelerate's AcceleratedScheduler.
template <class S>
class PreparedScheduler {
 public:
  PreparedScheduler(std::shared_ptr<S> scheduler, std::shared_ptr<detail::Engine> engine)
      : scheduler_(std::move(scheduler)), engine_(std::move(engine)) {
    // LibTorch's schedulers keep their state private: checkpoints store how many real steps
    // this one took, and load_state replays them on the freshly built scheduler.
    index_ = engine_->add_scheduler([s = scheduler_] { s->step(); });
  }
  void step() {
    if (!engine_->scheduler_should_step()) return;
    // Once, or num_processes times with scheduler_steps_per_process (Accelerate's arithmetic).
    for (int i = 0, n = engine_->scheduler_steps_per_call(); i < n; ++i) {
      scheduler_->step();
      engine_->scheduler_stepped(index_);
    }
  }
  S& scheduler() const { return *scheduler_; }
  S* operator->() const { return scheduler_.get(); }

 private:
  std::shared_ptr<S> scheduler_;
  std::shared_ptr<detail::Engine> engine_;
  size_t index_ = 0;
};

}  // namespace hasten
