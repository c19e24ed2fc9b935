// hasten::PreparedOptimizer: an optimizer after Accelerator::prepare, stepped by the engine.
#pragma once

#include <hasten/detail/engine.hpp>

#include <torch/optim/optimizer.h>

#include <memory>
#include <utility>
#include <vector>

namespace hasten {

// An optimizer after prepare: step() and zero_grad() do nothing on accumulation
// micro-batches, and step() is skipped when the precision plugin finds non-finite gradients.
class PreparedOptimizer {
 public:
  PreparedOptimizer(std::shared_ptr<detail::Engine> engine, size_t index)
      : engine_(std::move(engine)), index_(index) {}
  void step() { engine_->optimizer_step(index_); }
  void zero_grad() { engine_->optimizer_zero_grad(index_); }
  // True when the last step() that should have stepped was skipped (inf/nan gradients).
  bool step_was_skipped() const { return engine_->optimizer_step_was_skipped(index_); }
  torch::optim::Optimizer& optimizer() const { return engine_->optimizer(index_); }
  torch::optim::Optimizer* operator->() const { return &optimizer(); }
  template <class T>
  T& as() const {
    return dynamic_cast<T&>(optimizer());
  }
  std::vector<torch::optim::OptimizerParamGroup>& param_groups() const {
    return optimizer().param_groups();
  }
  size_t index() const { return index_; }

 private:
  std::shared_ptr<detail::Engine> engine_;
  size_t index_;
};

}  // namespace hasten
