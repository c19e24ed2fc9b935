// The scopes an Accelerator hands out for a block of a training loop: one micro-batch under
// gradient accumulation, an autocast region, and main-process-first ordering.
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
