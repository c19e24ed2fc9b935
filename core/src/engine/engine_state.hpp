// The engine's private state: what the Engine's source files share (the run's config, device,
// communicator and plugin instances, the prepared objects, the accumulation state). Only the
// Engine's own sources include it; everyone else sees only core/include/hasten/detail/engine.hpp.
#pragma once

#include <hasten/config.hpp>
#include <hasten/data.hpp>
#include <hasten/gradient_state.hpp>
#include <hasten/detail/engine.hpp>
#include <hasten/process.hpp>
#include <hasten/torch_compat.hpp>
#include <hasten/unit.hpp>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/current_stream.hpp"
#include "plugins/host_api.hpp"
#include "engine/precision_instance.hpp"
#include "engine/strategy_instance.hpp"
#include "trackers/running_tracker.hpp"

namespace torch::autograd {
struct Node;
}  // namespace torch::autograd

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

struct LoaderEntry {
  ShardSpec spec;
  int64_t epoch = 0;
  int64_t num_batches = 0;
  int64_t resume_batch = 0;  // after load_state: the first batch of the next epoch begun
  EpochPlan last_plan;       // the plan of the epoch begun last (gather_for_metrics after it)
  bool stream = false;       // a stream dataset: no size, batches until the stream ends
};

struct SchedulerEntry {
  std::function<void()> step_once;
  int64_t steps = 0;  // real steps taken (what a checkpoint stores)
  // step() calls on accumulation micro-batches under adjust_scheduler: they count toward a
  // bounded schedule's total_steps as Accelerate's bumped _step_count does (also stored).
  int64_t adjustments = 0;
};

struct ActiveLoader {
  size_t id = 0;
  int64_t batch = -1;
  int64_t num_batches = 0;
  int64_t num_padding = 0;
};

// The state behind a hasten::Work (Accelerator::all_reduce_). keep_alive is declared before
// work so that it is destroyed after it (members go in reverse order): the work's destructor
// first waits for the collective, or for CUDA work orders LibTorch's current stream after it
// (plugin_communicator.cpp), and only then is the buffer released. A CUDA buffer is also
// recorded on that current stream, so that the caching allocator reuses its memory only after
// the collective whichever stream allocated it (a stream-ordered wait orders just the one).
struct PendingWork {
  torch::Tensor keep_alive;  // the buffer must outlive the operation
  WorkPtr work;
  int64_t timeout_ms = 0;
  PendingWork() = default;
  PendingWork(const PendingWork&) = delete;
  PendingWork& operator=(const PendingWork&) = delete;
  ~PendingWork() {
    if (!work) return;
    work.reset();
    record_on_current_stream(keep_alive);
  }
};

struct Engine::Impl {
  Config config;
  ProcessInfo process;
  torch::Device device{torch::kCPU};
  DLDevice dl_device{kDLCPU, 0};
  HostContext host;
  std::unique_ptr<Store> store;
  std::unique_ptr<Communicator> comm;
  int64_t collective_seq = 0;  // debug mode: the n-th tensor collective of this rank
  std::unique_ptr<StrategyInstance> strategy;
  std::unique_ptr<PrecisionInstance> precision;
  bool precision_autocast = false;
  bool unit_events = false;  // the strategy wants unit forward events
  std::vector<std::unique_ptr<RunningTracker>> trackers;
  std::vector<ModelEntry> models;
  std::vector<OptimizerEntry> optimizers;
  std::vector<SchedulerEntry> schedulers;
  std::vector<CheckpointObject> checkpoint_objects;
  int64_t save_iteration = 0;  // the next automatic checkpoint's number
  // Config `resume`: settled by the first load_state, resumed_from() or start of the loop.
  bool resume_settled = false;
  std::string resumed_from;  // the checkpoint this run continued from ("" if none)
  std::vector<LoaderEntry> loaders;
  std::vector<ActiveLoader> active;  // innermost loader last
  // The loader whose iteration ended last, and whether it ran to the end of its epoch (a
  // whole-epoch gather_for_metrics after the loop drops that epoch's padding).
  std::optional<size_t> finished_loader;

  // Gradient accumulation state.
  bool sync = true;
  int64_t accum_step = 0;
  int64_t window = 1;  // micro-batches in the current accumulation window
  int accumulate_depth = 0;
  bool backward_in_scope = false;       // a backward ran inside the live accumulate scope
  bool scope_ended_unused = false;      // the last scope ended with no backward inside it
  bool trigger = false;

  // join_uneven_inputs (join.cpp).
  bool join_open = false;         // a join scope is open
  bool join_live = false;         // ... and inputs may be uneven: the engine reduces
  JoinOptions join_options;
  std::optional<bool> join_even_batches;  // the override for epochs begun inside the scope
  std::vector<int64_t> join_last_partial;  // the active ranks of the last round some had left
  // Under a sharding strategy (zero stages 1 and 2) the strategy keeps reducing; a rank out of
  // batches shadows the others' backwards, optimizer steps and clipping instead (join.cpp).
  bool join_sharded = false;

  // Whether backward reduces this model's gradients now; tells the strategy when it changes.
  bool wants_gradient_sync(const ModelEntry& e) const;
  void apply_gradient_sync(ModelEntry& e);
  // join.cpp: after a backward inside a live join scope, reduces the joined models' gradients
  // with the ranks that still train (the ranks that left answer with zeros).
  void join_reduce_after_backward();
  // join.cpp, sharded: the rounds that tell ranks out of batches what to shadow. Before a
  // reducing backward (returns the factor the loss is multiplied by: 1, or world / ranks
  // training without divide_by_initial_world_size), before an optimizer step, before clipping.
  double join_round_before_backward(const torch::Tensor& loss);
  void join_round_before_step(size_t optimizer);
  void join_round_before_clip(size_t model, double max_norm, double norm_type);
  // join_end under zero1/zero2: a rank out of batches shadows those rounds until none trains.
  void join_shadow();
  // One real optimizer step through the precision plugin and the strategy (step.cpp).
  void step_optimizer(OptimizerEntry& e);

  const ActiveLoader* innermost() const { return active.empty() ? nullptr : &active.back(); }
  bool end_of_dataloader() const {
    auto* a = innermost();
    return a != nullptr && a->batch >= 0 && a->batch == a->num_batches - 1;
  }

  // Refuses a backward that reaches a prepared model's parameters without a call of the
  // prepared model (bypassed_forward.cpp).
  void check_prepared_forwards(const torch::Tensor& loss);

  // An allreduce of a whole tensor over the communicator (collectives.cpp).
  void allreduce_(torch::Tensor& t, hasten_reduce_op op);
  // Debug mode: every rank checks that all ranks are in the same collective (collectives.cpp).
  void check_collective(const std::string& op, const torch::Tensor& t);
  std::string wait_for_collective(int rank, int64_t n, const std::string& mine);

  // Reads one checkpoint directory into this state, phase by phase (checkpoint_load.cpp).
  class CheckpointLoad;
};

}  // namespace hasten::detail
