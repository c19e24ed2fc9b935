// The engine's private state: the Engine composes the subsystems' states (each declared in its
// subsystem's header: data/loader_registry.hpp, checkpoint/checkpoint_registry.hpp,
// engine/accumulation_state.hpp, engine/join_state.hpp, engine/prepared_objects.hpp,
// comm/pending_work.hpp) beside the run's settings. Only the Engine's own sources include it;
// everyone else sees only core/include/hasten/detail/engine.hpp.
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
#include <set>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_registry.hpp"
#include "comm/comm_counters.hpp"
#include "comm/communicator.hpp"
#include "comm/pending_work.hpp"
#include "comm/process_groups.hpp"
#include "data/loader_registry.hpp"
#include "engine/accumulation_state.hpp"
#include "engine/join_state.hpp"
#include "engine/precision_instance.hpp"
#include "engine/prepared_objects.hpp"
#include "engine/strategy_instance.hpp"
#include "plugins/host_api.hpp"
#include "trackers/running_tracker.hpp"

namespace torch::autograd {
struct Node;
}  // namespace torch::autograd

namespace hasten::detail {

struct Engine::Impl {
  // The run, settled at construction (engine_setup.cpp) and read by every subsystem.
  Config config;
  ProcessInfo process;
  torch::Device device{torch::kCPU};
  DLDevice dl_device{kDLCPU, 0};
  HostContext host;
  // comm/: the rendezvous store and the communicator the collectives go through.
  std::unique_ptr<Store> store;
  std::unique_ptr<Communicator> comm;
  // The device mesh's groups (parallelism_config), split from comm and destroyed before it.
  std::unique_ptr<ProcessGroups> groups;
  // The bytes comm and the groups' communicators carried (comm_stats); null with one process.
  std::shared_ptr<CommCounters> comm_counters;
  int64_t collective_seq = 0;  // debug mode: the n-th tensor collective of this rank
  bool trigger = false;        // set_trigger()'s flag until check_trigger() reads it
  // plugins/: the instances of this run's strategy and precision.
  std::unique_ptr<StrategyInstance> strategy;
  std::unique_ptr<PrecisionInstance> precision;
  bool precision_autocast = false;
  bool unit_events = false;  // the strategy wants unit forward events
  // sharded_build.cpp (config key sharded_init): the units the strategy was handed as they
  // were built, and the end of the window in which units are built sharded.
  std::vector<const torch::nn::Module*> built_sharded;
  void start_sharded_build(Engine& self);
  static void stop_sharded_build(const Engine& self);
  std::vector<std::unique_ptr<RunningTracker>> trackers;  // trackers/
  std::set<std::pair<std::string, int32_t>> tracker_skips;  // (tracker, kKeeps* bit) named once (tracker_media.cpp)
  // engine/: the prepared objects and the lifecycle's state machines.
  std::vector<ModelEntry> models;
  std::vector<OptimizerEntry> optimizers;
  std::vector<SchedulerEntry> schedulers;
  AccumulationState accumulation;  // accumulation.cpp
  JoinState join;                  // join.cpp
  LoaderRegistry data;             // loader_tracking.cpp
  CheckpointRegistry checkpoints;  // checkpoint/
  // profiling.cpp (config key profile): where the profiler's window stands.
  struct ProfileWindow {
    int64_t step = 0;   // optimizer steps of the first optimizer so far
    int64_t first = 0;  // the first recorded step
    bool prepared = false, recording = false, done = false;
    int windows = 0;  // traces this run wrote (a later window's file gets a number)
    void* step_marker = nullptr;  // the open ProfilerStep#N range (an at::RecordFunction)
  } profiling;
  void profile_tick();              // at construction and after each step of optimizer 0
  void profile_finish() noexcept;   // the window's end, or the run's

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
  // register_save_state_pre_hook / register_load_state_pre_hook (checkpoint_save.cpp): runs
  // them and returns, per prepared model, whether the call still writes (reads) its weights.
  std::vector<bool> run_state_pre_hooks(bool save, const std::string& dir);
  // One real optimizer step through the precision plugin and the strategy (step.cpp).
  void step_optimizer(OptimizerEntry& e);

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
