// The prepared models, optimizers and schedulers as the engine tracks them: what each model's
// gradient sync depends on (gradient_sync.cpp), which models an optimizer steps, a
// scheduler's step counts (what checkpoints store).
#pragma once

#include <hasten/torch_compat.hpp>
#include <hasten/unit.hpp>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace hasten::detail {

struct ModelEntry {
  std::shared_ptr<torch::nn::Module> module;
  bool sync_enabled = true;  // what the strategy was last told
  // What decides it (gradient_sync.cpp, apply_gradient_sync): the live accumulate scope keeps
  // this micro-batch local, live no_sync scopes, the last call of the model ran under no_sync
  // (DDP decides at forward), live trigger_sync_in_backward scopes, a join scope that reduces
  // this model's gradients itself (join.cpp).
  bool accumulate_local = false;
  int no_sync_depth = 0;
  bool called_local = false;
  int trigger_depth = 0;
  bool joined = false;
  std::vector<UnitBase*> units;  // nested hasten::Unit modules (1..n), attached to this engine
  bool root_is_unit = false;     // the model is itself a hasten::Unit (its forward reports unit 0)
  // Calls of the prepared model since the last backward, and the autograd nodes of their
  // outputs: a backward that reaches this model's parameters through none of them used the
  // module directly (`model->forward(x)`), past autocast and the strategy's events.
  bool forwarded = false;
  bool outputs_untracked = false;  // its forward returns a type hasten cannot look into
  std::vector<compat::WeakNodePtr> output_nodes;
};

struct OptimizerEntry {
  torch::optim::Optimizer* optimizer = nullptr;
  std::shared_ptr<void> owner;
  bool last_skipped = false;
  std::vector<size_t> models;  // the prepared models whose parameters it steps
  bool join_zeroed = false;    // zero_grad() since the last join round (join.cpp, sharded)
};

struct SchedulerEntry {
  std::function<void()> step_once;
  int64_t steps = 0;  // real steps taken (what a checkpoint stores)
  // step() calls on accumulation micro-batches under adjust_scheduler: they count toward a
  // bounded schedule's total_steps as Accelerate's bumped _step_count does (also stored).
  int64_t adjustments = 0;
};

}  // namespace hasten::detail
