// The scopes an Accelerator hands out for a block of a training loop: one micro-batch under
// gradient accumulation, no_sync and trigger_sync_in_backward, join_uneven_inputs, an autocast
// region, and main-process-first ordering.
#pragma once

#include <hasten/detail/engine.hpp>

#include <cstddef>
#include <exception>
#include <memory>
#include <utility>
#include <vector>

namespace hasten {

// The scope of one micro-batch under gradient accumulation (see Accelerator::accumulate).
class [[nodiscard]] AccumulateScope {
 public:
  AccumulateScope(std::shared_ptr<detail::Engine> engine, std::vector<size_t> models)
      : engine_(std::move(engine)), models_(std::move(models)) {
    engine_->begin_accumulate(models_);
  }
  ~AccumulateScope() {
    if (engine_) engine_->end_accumulate(models_);
  }
  AccumulateScope(AccumulateScope&& other) noexcept
      : engine_(std::move(other.engine_)), models_(std::move(other.models_)) {}
  AccumulateScope(const AccumulateScope&) = delete;
  AccumulateScope& operator=(const AccumulateScope&) = delete;
  AccumulateScope& operator=(AccumulateScope&&) = delete;
  bool sync_gradients() const { return engine_->sync_gradients(); }

 private:
  std::shared_ptr<detail::Engine> engine_;
  std::vector<size_t> models_;
};

// A scope that keeps the given models' gradients local (Accelerator::no_sync), or makes the
// backward inside it reduce them (Accelerator::trigger_sync_in_backward).
class [[nodiscard]] GradientSyncScope {
 public:
  GradientSyncScope(std::shared_ptr<detail::Engine> engine, std::vector<size_t> models, bool trigger)
      : engine_(std::move(engine)), models_(std::move(models)), trigger_(trigger) {
    if (trigger_)
      engine_->trigger_sync_begin(models_);
    else
      engine_->no_sync_begin(models_);
  }
  ~GradientSyncScope() {
    if (!engine_) return;
    if (trigger_)
      engine_->trigger_sync_end(models_);
    else
      engine_->no_sync_end(models_);
  }
  GradientSyncScope(GradientSyncScope&& other) noexcept
      : engine_(std::move(other.engine_)), models_(std::move(other.models_)), trigger_(other.trigger_) {}
  GradientSyncScope(const GradientSyncScope&) = delete;
  GradientSyncScope& operator=(const GradientSyncScope&) = delete;
  GradientSyncScope& operator=(GradientSyncScope&&) = delete;

 private:
  std::shared_ptr<detail::Engine> engine_;
  std::vector<size_t> models_;
  bool trigger_;
};

// The scope of Accelerator::join_uneven_inputs: when it ends, a rank that ran out of batches
// answers the other ranks' gradient reductions until every rank has reached its end (a
// collective). Ended by an exception, it only restores the state (no collective).
class [[nodiscard]] JoinScope {
 public:
  JoinScope(std::shared_ptr<detail::Engine> engine, const std::vector<size_t>& models, const JoinOptions& options)
      : engine_(std::move(engine)) {
    engine_->join_begin(models, options);
  }
  ~JoinScope() noexcept(false) {
    if (!engine_) return;
    if (std::uncaught_exceptions() > uncaught_) {
      engine_->join_abandon();
      return;
    }
    engine_->join_end();
  }
  JoinScope(JoinScope&& other) noexcept : engine_(std::move(other.engine_)), uncaught_(other.uncaught_) {}
  JoinScope(const JoinScope&) = delete;
  JoinScope& operator=(const JoinScope&) = delete;
  JoinScope& operator=(JoinScope&&) = delete;

 private:
  std::shared_ptr<detail::Engine> engine_;
  int uncaught_ = std::uncaught_exceptions();
};

// Mixed-precision autocast for code outside a prepared model's forward (a loss, say).
class [[nodiscard]] AutocastScope {
 public:
  explicit AutocastScope(std::shared_ptr<detail::Engine> engine)
      : engine_(std::move(engine)), token_(engine_->autocast_enter()) {}
  ~AutocastScope() { engine_->autocast_exit(token_); }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  std::shared_ptr<detail::Engine> engine_;
  void* token_;
};

// Runs a block on the main process first: the others wait at a barrier, then run it.
class [[nodiscard]] MainProcessFirst {
 public:
  MainProcessFirst(std::shared_ptr<detail::Engine> engine, bool main)
      : engine_(std::move(engine)), main_(main) {
    if (!main_) engine_->wait_for_everyone();
  }
  ~MainProcessFirst() noexcept(false) {
    if (!main_) return;
    // The main process's block threw: still release the others (they wait at the barrier),
    // but a failing barrier must not end the program while that error unwinds.
    if (std::uncaught_exceptions() > uncaught_) {
      try {
        engine_->wait_for_everyone();
      } catch (...) {
      }
      return;
    }
    engine_->wait_for_everyone();
  }
  MainProcessFirst(const MainProcessFirst&) = delete;
  MainProcessFirst& operator=(const MainProcessFirst&) = delete;

 private:
  std::shared_ptr<detail::Engine> engine_;
  bool main_;
  int uncaught_ = std::uncaught_exceptions();
};

}  // namespace hasten
