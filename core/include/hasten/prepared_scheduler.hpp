// hasten::PreparedScheduler: a learning-rate scheduler after Accelerator::prepare.
#pragma once

#include <hasten/detail/engine.hpp>

#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

namespace hasten {

// A schedule bounded by a number of steps (hasten::schedulers::OneCycleLR, or a user's class
// with `total_steps()` and `last_step()`): Accelerate's AcceleratedScheduler bounds such a
// scheduler (Python's hasattr(scheduler, "total_steps")) in its num_processes loop.
template <class S, class = void>
struct is_bounded_schedule : std::false_type {};
template <class S>
struct is_bounded_schedule<S, std::void_t<decltype(static_cast<int64_t>(std::declval<const S&>().total_steps())),
                                          decltype(static_cast<int64_t>(std::declval<const S&>().last_step()))>>
    : std::true_type {};

// A learning-rate scheduler after prepare: step() advances the schedule once per real
// optimizer step (not on accumulation micro-batches, not when the step was skipped), unless
// step_scheduler_with_optimizer is false; num_processes times per optimizer step with
// scheduler_steps_per_process (unless split_batches), as Accelerate's AcceleratedScheduler,
// with its bound on schedules that have total_steps() and adjust_scheduler's count.
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
    engine_->scheduler_called(index_);  // adjust_scheduler's count on a micro-batch
    if (!engine_->scheduler_should_step()) return;
    // Once, or num_processes times with scheduler_steps_per_process (Accelerate's arithmetic).
    for (int i = 0, n = engine_->scheduler_steps_per_call(); i < n; ++i) {
      if constexpr (is_bounded_schedule<S>::value) {
        // Accelerate steps a schedule with total_steps only while its _step_count (1 at
        // construction, + each step, + adjust_scheduler's micro-batches) <= total_steps.
        if (engine_->scheduler_bounded() &&
            static_cast<int64_t>(scheduler_->last_step()) + 1 + engine_->scheduler_adjustments(index_) >
                static_cast<int64_t>(scheduler_->total_steps()))
          continue;
      }
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
