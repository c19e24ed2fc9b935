// The Accelerator's engine: the non-template half of the public API. Header templates
// (prepared models, loaders, schedulers) call into it; users do not need it directly.
#pragma once

#include <hasten/comm_stats.hpp>
#include <hasten/config.hpp>
#include <hasten/data.hpp>
#include <hasten/error.hpp>
#include <hasten/gradient_state.hpp>
#include <hasten/process.hpp>
#include <hasten/state_hooks.hpp>
#include <hasten/tracker_handle.hpp>
#include <hasten/unit.hpp>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace hasten {
enum class ReduceOp { Sum = 0, Avg = 1, Min = 2, Max = 3 };
// Accelerator::init_trackers's hyperparameters and Accelerator::log's values.
using HparamValue = std::variant<bool, int64_t, double, std::string>;
using Hparams = std::vector<std::pair<std::string, HparamValue>>;
using Metrics = std::vector<std::pair<std::string, double>>;
// Accelerator::init_trackers's init_kwargs: per tracker (as `trackers` names it), a mapping of
// its options as YAML or JSON text ("{run_name: baseline}"), over its tracker_options.
using TrackerKwargs = std::map<std::string, std::string>;
// A cell of Accelerator::log_table: text or a number.
using TableCell = std::variant<std::string, double>;
}  // namespace hasten

namespace hasten::detail {

struct PendingWork;

// One process's group of the device mesh (DeviceMesh, ProcessGroup).
struct MeshGroupView {
  std::vector<int> ranks;  // members' world ranks, ascending
  int rank = 0;            // this process's place in ranks
  int size() const { return static_cast<int>(ranks.size()); }
};

// Accelerator::on_process / on_local_process: an index within [0, count).
inline void check_process_index(const char* what, int index, int count) {
  if (index < 0 || index >= count)
    throw UsageError(std::string(what) + ": process index " + std::to_string(index) + " is out of range [0, " +
                     std::to_string(count) + ")");
}

class Engine {
 public:
  explicit Engine(const Options& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const Config& config() const;
  void set_debug(bool enabled);
  const ProcessInfo& process() const;
  torch::Device device() const;
  std::string strategy_name() const;
  std::string precision_name() const;

  // Models.
  size_t add_model(std::shared_ptr<torch::nn::Module> module);
  // Marks the outermost checkpointable units of `module` (itself when it is one); returns how many.
  size_t checkpoint_activations(torch::nn::Module& module);
  std::optional<size_t> find_model(const torch::nn::Module* module) const;
  // Sharding units: events around the prepared model's forward (unit 0) and around every
  // hasten::Unit's forward, for strategies that want them.
  bool unit_events() const;
  void model_forward_enter(size_t model);
  void model_forward_exit(size_t model, std::vector<torch::Tensor>& outputs);
  void unit_enter(size_t model, uint32_t unit);
  void unit_exit(size_t model, uint32_t unit, std::vector<torch::Tensor>& outputs);
  // The outputs of a prepared model's call where no strategy event reports them (the
  // backward check of bypassed_forward.cpp looks for them).
  void model_forward_outputs(size_t model, const std::vector<torch::Tensor>& outputs);
  // Refuses unwrap_model where the module's parameters are freed shards now.
  void check_unwrap(size_t model) const;
  // Fills `copy` (a clone of the model's module) with the model's full parameters and
  // buffers, on every rank (collective).
  void fill_full_copy(size_t model, torch::nn::Module& copy);
  // Rethrows an error from a prepared model's forward with what a sharding strategy knows.
  [[noreturn]] void forward_failed(size_t model, const std::exception& error);
  MemoryReport memory_report();
  // kind 0: full tensors on rank 0 (collective); kind 1: this rank's shards.
  std::vector<std::pair<std::string, torch::Tensor>> state_dict(size_t model, int kind);
  // A prepared model is about to run (applies config resume on the first call).
  void forward_begins();
  void* autocast_enter();
  void autocast_exit(void* token) noexcept;

  // Optimizers. `owner` keeps a shared optimizer alive (may be null: the caller owns it).
  size_t add_optimizer(torch::optim::Optimizer& optimizer, std::shared_ptr<void> owner);
  torch::optim::Optimizer& optimizer(size_t index);
  void optimizer_step(size_t index);
  void optimizer_zero_grad(size_t index);
  bool optimizer_step_was_skipped(size_t index) const;
  bool any_optimizer_step_skipped() const;

  // Schedulers: `step_once` steps the scheduler (load_state replays the saved count).
  size_t add_scheduler(std::function<void()> step_once);
  bool scheduler_should_step() const;
  void scheduler_stepped(size_t index);
  // Called by every step(): on an accumulation micro-batch under adjust_scheduler (with
  // scheduler_steps_per_process) counts one adjustment, Accelerate's `_step_count += 1`.
  void scheduler_called(size_t index);
  // Whether a schedule with total_steps() is bounded as Accelerate's AcceleratedScheduler
  // bounds it (scheduler_steps_per_process, stepping with the optimizer, no split_batches),
  // and the adjustments counted toward that bound.
  bool scheduler_bounded() const;
  int64_t scheduler_adjustments(size_t index) const;

  // Data loaders.
  size_t add_loader(int64_t dataset_size, const DataLoaderOptions& options);
  // A loader over a stream dataset (its number of batches is not known in advance).
  size_t add_stream_loader(const DataLoaderOptions& options);
  EpochPlan loader_begin_epoch(size_t loader);
  // skip_first_batches: the epoch begins at batch `skip` (or later, after load_state).
  EpochPlan loader_begin_epoch(size_t loader, int64_t skip);
  // The epoch the loader's next iteration begins, and set_epoch.
  int64_t loader_epoch(size_t loader) const;
  void loader_set_epoch(size_t loader, int64_t epoch);
  // Where the loader's next iteration begins, as save_state records it, and going back there
  // (PreparedDataLoader::state_dict / load_state_dict).
  LoaderState loader_state(size_t loader) const;
  void loader_load_state(size_t loader, const LoaderState& state);
  void loader_at(size_t loader, int64_t batch, int64_t num_batches, int64_t num_padding);
  void loader_end(size_t loader) noexcept;
  int64_t loader_num_batches(size_t loader) const;
  // Whether the loader dispatches (dispatch_batches resolved, more than one process).
  bool loader_dispatches(size_t loader) const;

  // Gradient accumulation.
  void begin_accumulate(const std::vector<size_t>& models);
  void end_accumulate(const std::vector<size_t>& models) noexcept;
  bool sync_gradients() const;
  int gradient_accumulation_steps() const;
  GradientState gradient_state() const;
  // no_sync and trigger_sync_in_backward scopes (gradient_sync.cpp), and a prepared model's
  // call (a forward under no_sync keeps its backward local, as DDP decides at forward).
  void no_sync_begin(const std::vector<size_t>& models);
  void no_sync_end(const std::vector<size_t>& models) noexcept;
  void trigger_sync_begin(const std::vector<size_t>& models);
  void trigger_sync_end(const std::vector<size_t>& models) noexcept;
  void model_called(size_t model);
  // join_uneven_inputs (join.cpp): begin applies the even_batches override; end answers the
  // other ranks' gradient reductions until every rank has joined.
  void join_begin(const std::vector<size_t>& models, const JoinOptions& options);
  void join_end();
  void join_abandon() noexcept;
  // How many times a prepared scheduler's step() steps it (scheduler_steps_per_process).
  int scheduler_steps_per_call() const;

  void backward(const torch::Tensor& loss, bool retain_graph);
  double clip_grad_norm(size_t model, double max_norm, double norm_type);
  double clip_grad_norm(const std::vector<torch::Tensor>& parameters, double max_norm,
                        double norm_type);
  void clip_grad_value(size_t model, double clip_value);
  void clip_grad_value(const std::vector<torch::Tensor>& parameters, double clip_value);
  // The prepared model whose parameters these are, when a sharding strategy keeps their
  // gradients in shards (nullopt otherwise); a part of such a model is a UsageError.
  std::optional<size_t> model_of_parameters(const std::vector<torch::Tensor>& parameters, const char* op) const;
  void unscale_gradients();
  double loss_scale() const;

  // Collectives on tensors (every rank must call them).
  torch::Tensor gather(const torch::Tensor& tensor);
  torch::Tensor gather_for_metrics(const torch::Tensor& tensor);
  torch::Tensor reduce(const torch::Tensor& tensor, const std::string& op);
  torch::Tensor broadcast(const torch::Tensor& tensor, int from);
  std::string broadcast(const std::string& text, int from);
  torch::Tensor pad_across_processes(const torch::Tensor& tensor, int64_t dim, double pad_value,
                                     bool pad_first);
  void wait_for_everyone();
  std::shared_ptr<PendingWork> all_reduce_(torch::Tensor& tensor, ReduceOp op);
  torch::Tensor reduce_scatter(const torch::Tensor& tensor, ReduceOp op);
  void all_gather_into(torch::Tensor& output, const torch::Tensor& input);
  void reduce_scatter_into(torch::Tensor& output, const torch::Tensor& input, ReduceOp op);
  void broadcast_(torch::Tensor& tensor, int from);
  std::string backend_for(const torch::Device& device) const;
  CommStats comm_stats() const;  // comm/group_collectives.cpp
  // The device mesh (parallelism_config) and collectives over one of its groups
  // (comm/group_collectives.cpp).
  std::vector<std::pair<std::string, int>> mesh_dims() const;
  MeshGroupView mesh_group(const std::string& name) const;
  void group_all_reduce_(const std::string& group, torch::Tensor& tensor, ReduceOp op);
  torch::Tensor group_all_gather(const std::string& group, const torch::Tensor& tensor);
  torch::Tensor group_reduce_scatter(const std::string& group, const torch::Tensor& tensor, ReduceOp op);
  void group_broadcast_(const std::string& group, torch::Tensor& tensor, int from);
  void set_trigger();
  bool check_trigger();
  bool stop_requested();  // stop_signals.cpp

  // Checkpoints (checkpoint_save.cpp, checkpoint_load.cpp). An object registered for checkpointing saves and loads
  // either bytes or named tensors.
  struct CheckpointObject {
    std::function<std::string()> save_bytes;
    std::function<void(const std::string&)> load_bytes;
    std::function<std::vector<std::pair<std::string, torch::Tensor>>()> save_tensors;
    std::function<void(const std::vector<std::pair<std::string, torch::Tensor>>&)> load_tensors;
  };
  void register_for_checkpointing(CheckpointObject object);
  // Accelerator::register_for_checkpointing's object: state_dict() returns std::string (bytes)
  // or named tensors, with the matching load_state_dict(const ...&).
  template <class T>
  static CheckpointObject checkpoint_object(T& object) {
    CheckpointObject o;
    using State = std::decay_t<decltype(object.state_dict())>;
    if constexpr (std::is_same_v<State, std::string>) {
      o.save_bytes = [&object] { return object.state_dict(); };
      o.load_bytes = [&object](const std::string& bytes) { object.load_state_dict(bytes); };
    } else {
      static_assert(std::is_same_v<State, std::vector<std::pair<std::string, torch::Tensor>>>,
                    "register_for_checkpointing: state_dict() must return std::string or hasten::NamedTensors");
      o.save_tensors = [&object] { return object.state_dict(); };
      o.load_tensors = [&object](const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
        object.load_state_dict(tensors);
      };
    }
    return o;
  }
  // Pre-hooks of save_state (save = true) and load_state; the id removes one.
  size_t add_state_pre_hook(bool save, StateHook hook);
  void remove_state_pre_hook(size_t id) noexcept;
  std::string save_state(const std::string& dir);
  std::string load_state(const std::string& dir);
  int64_t save_iteration() const;
  // Config `resume` (no, auto, a directory), applied once: at the first of resume(), the
  // first epoch of a prepared loader and the first call of a prepared model. Returns the
  // checkpoint the run continued from ("" if none).
  std::string resume();
  // Writes the model's full weights into dir in Hugging Face's layout (model_export.cpp).
  void save_model(size_t model, const std::string& dir, uint64_t max_shard_bytes);

  // Trackers.
  void init_trackers(const std::string& project, const std::string& hparams_json, const TrackerKwargs& init_kwargs = {});
  void init_trackers(const std::string& project, const Hparams& hparams, const TrackerKwargs& init_kwargs = {});
  // Rank 0's generator states on every rank: "torch" (CPU), "cuda" (this rank's device),
  // "generator" (the one given). Checks every name before the first collective.
  void synchronize_rng_states(const std::vector<std::string>& rng_types, torch::Generator generator);
  void log(const std::vector<std::pair<std::string, double>>& values, int64_t step);
  // A running tracker by name (trackers.cpp); self: this engine, which the handle's log holds weakly.
  TrackerHandle get_tracker(const std::string& name, std::weak_ptr<Engine> self);
  void log_text(const std::string& name, const std::string& text, int64_t step);
  // tracker_media.cpp: images, histograms and tables, to the trackers that keep them.
  void log_images(const std::vector<std::pair<std::string, torch::Tensor>>& images, int64_t step);
  void log_histogram(const std::string& name, const torch::Tensor& values, int64_t step);
  void log_table(const std::string& name, const std::vector<std::string>& columns,
                 const std::vector<std::vector<TableCell>>& rows, int64_t step);
  void end_training();
  // A profiling window from this step on (profiling.cpp); UsageError while one is open.
  void profile(ProfileSettings window);

 private:
  friend void unit_built(torch::nn::Module& unit);  // sharded_build.cpp
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hasten::detail
