// hasten::Accelerator: a plain LibTorch training loop, four changes away from running on
// one CPU, many processes or many machines.
//
//   hasten::Accelerator acc;                                  // defaults < file < env < code
//   auto [model, opt, loader, sched] = acc.prepare(net, optimizer, data, scheduler);
//   for (auto& batch : loader) {
//     auto scope = acc.accumulate(model);                      // decides sync for this batch
//     auto loss = torch::nn::functional::cross_entropy(model(batch.input), batch.target);
//     acc.backward(loss);
//     if (acc.sync_gradients()) acc.clip_grad_norm_(model, 1.0);
//     opt.step(); sched.step(); opt.zero_grad();              // no-ops while accumulating
//   }
//   acc.end_training();
//
// Prepared objects share the Accelerator's state and stay valid after it goes out of scope.
// They, the scopes, Work and the learning-rate schedules have headers of their own
// (prepared_*.hpp, scopes.hpp, work.hpp, schedulers.hpp); a program needs only this one.
#pragma once

#include <hasten/config.hpp>
#include <hasten/data.hpp>
#include <hasten/detail/engine.hpp>
#include <hasten/device_mesh.hpp>
#include <hasten/detail/prepare.hpp>
#include <hasten/detail/prepare_traits.hpp>
#include <hasten/error.hpp>
#include <hasten/logging.hpp>
#include <hasten/object_collectives.hpp>
#include <hasten/prepared_data_loader.hpp>
#include <hasten/prepared_model.hpp>
#include <hasten/prepared_optimizer.hpp>
#include <hasten/prepared_scheduler.hpp>
#include <hasten/process.hpp>
#include <hasten/run_on.hpp>
#include <hasten/safetensors.hpp>
#include <hasten/schedulers.hpp>
#include <hasten/scopes.hpp>
#include <hasten/unit.hpp>
#include <hasten/weights.hpp>
#include <hasten/work.hpp>

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>

#include <functional>
#include <initializer_list>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace hasten {

// Seeds LibTorch's generators on this process (plus its rank with device_specific).
void set_seed(uint64_t seed, bool device_specific = false);

class Accelerator {
 public:
  // Configuration from defaults, the config file and the environment.
  Accelerator() : Accelerator(Options{}) {}
  // ... with options given in code on top.
  explicit Accelerator(const Options& options)
      : engine_(std::make_shared<detail::Engine>(options)) {}

  // Prepares models, optimizers, data loaders and schedulers, several of each in any order;
  // returns them in the same order (one object alone comes back unwrapped):
  //   model:     std::shared_ptr<Impl> or a TORCH_MODULE holder  -> PreparedModel<that type>
  //   optimizer: an lvalue torch::optim::Optimizer (the caller keeps it alive) or a
  //              std::shared_ptr to one                         -> PreparedOptimizer
  //   loader:    hasten::DataLoader<Dataset>                      -> PreparedDataLoader<Dataset>
  //              (not torch::data::make_data_loader's: wrap its dataset in hasten::DataLoader)
  //   scheduler: an lvalue torch::optim::LRScheduler or a shared_ptr -> PreparedScheduler<S>
  // Models are prepared first, so the strategy sees every model before any optimizer.
  template <class... T>
  auto prepare(T&&... objects) {
    static_assert(sizeof...(T) > 0, "prepare() needs at least one object");
    (detail::check_preparable<T>(), ...);
    (detail::prepare_model_pass(*engine_, objects), ...);
    std::tuple<typename detail::prepared<T>::type...> out{detail::prepare_one(engine_, std::forward<T>(objects))...};
    if constexpr (sizeof...(T) == 1)
      return std::get<0>(std::move(out));
    else
      return out;
  }

  // The scope of one micro-batch: decides whether this micro-batch synchronises gradients
  // (every gradient_accumulation_steps-th, and always the loader's last batch) and, when it
  // does not, suspends the strategy's gradient communication for the given models.
  template <class... M>
  AccumulateScope accumulate(const PreparedModel<M>&... models) {
    return AccumulateScope(engine_, std::vector<size_t>{models.index()...});
  }
  bool sync_gradients() const { return engine_->sync_gradients(); }
  int gradient_accumulation_steps() const { return engine_->gradient_accumulation_steps(); }
  // Where accumulation and iteration stand: sync_gradients, end_of_dataloader, remainder,
  // the active loader, the accumulation options (Accelerate's accelerator.gradient_state).
  GradientState gradient_state() const { return engine_->gradient_state(); }

  // Inside this scope backward keeps the models' gradients local (they add up on each rank)
  // under every strategy; so does a backward of a loss whose forward ran inside it, as with
  // DDP. The first backward outside it (after a forward outside it) reduces the sum.
  template <class... M>
  GradientSyncScope no_sync(const PreparedModel<M>&... models) {
    return GradientSyncScope(engine_, std::vector<size_t>{models.index()...}, false);
  }
  // The backward inside this scope reduces the models' gradients, even of losses whose
  // forwards ran under no_sync (Accelerate's trigger_sync_in_backward).
  template <class... M>
  GradientSyncScope trigger_sync_in_backward(const PreparedModel<M>&... models) {
    return GradientSyncScope(engine_, std::vector<size_t>{models.index()...}, true);
  }

  // A prepared model of any type, as join_uneven_inputs's list takes it.
  class ModelRef {
   public:
    template <class M>
    ModelRef(const PreparedModel<M>& model) : index_(model.index()) {}  // NOLINT: implicit on purpose
    size_t index() const { return index_; }

   private:
    size_t index_;
  };
  // Training or evaluation on uneven inputs: with even_batches false (the config, or the
  // override in options for loaders whose epochs begin inside the scope) ranks may have
  // different numbers of batches; a rank that runs out waits at the end of the scope and
  // answers the others' gradient reductions of these models with zeros, and the models end
  // with the weights of the last rank to finish. Under strategies whose gradients live in the
  // parameters (ddp, single); other collectives inside the scope must stay even.
  JoinScope join_uneven_inputs(std::initializer_list<ModelRef> models, JoinOptions options = {}) {
    std::vector<size_t> indices;
    for (const auto& m : models) indices.push_back(m.index());
    return JoinScope(engine_, indices, options);
  }

  // Activation checkpointing (torch.utils.checkpoint; config key activation_checkpointing): the
  // outermost hasten::Unit blocks in `module` (or itself) run again in backward instead of
  // keeping activations; returns how many (UsageError: none). Before or after prepare.
  template <class M>
  size_t checkpoint_activations(const M& module) { return engine_->checkpoint_activations(detail::module_of(module)); }

  // loss.backward() with the precision plugin's scaling, the strategy's hooks and, inside
  // accumulate(), division by the number of micro-batches of this accumulation window.
  void backward(const torch::Tensor& loss, bool retain_graph = false) {
    engine_->backward(loss, retain_graph);
  }

  // Clips the model's gradients (unscaling them first under fp16) to max_norm; returns the
  // total norm before clipping, over every rank's share where gradients are sharded.
  template <class M>
  double clip_grad_norm_(const PreparedModel<M>& model, double max_norm, double norm_type = 2.0) {
    return engine_->clip_grad_norm(model.index(), max_norm, norm_type);
  }
  double clip_grad_norm_(const std::vector<torch::Tensor>& parameters, double max_norm,
                         double norm_type = 2.0) {
    return engine_->clip_grad_norm(parameters, max_norm, norm_type);
  }
  template <class M>
  void clip_grad_value_(const PreparedModel<M>& model, double clip_value) {
    engine_->clip_grad_value(model.index(), clip_value);
  }
  // The parameter-list spellings (Accelerate's clip_grad_*_(model.parameters(), ...)): a
  // prepared model's parameters under a sharding strategy mean that model (its gradients live
  // in the shards); a part of such a model is an error.
  void clip_grad_value_(const std::vector<torch::Tensor>& parameters, double clip_value) {
    engine_->clip_grad_value(parameters, clip_value);
  }
  // Divides gradients by the loss scale now (fp16); later calls in the same step do nothing.
  void unscale_gradients() { engine_->unscale_gradients(); }
  bool optimizer_step_was_skipped() const { return engine_->any_optimizer_step_skipped(); }
  // What this rank holds: full parameters, parameter shards, gradients, optimizer state,
  // now and at their peak since prepare.
  MemoryReport memory_report() { return engine_->memory_report(); }
  // The precision plugin's current loss scale (1 without loss scaling).
  double loss_scale() const { return engine_->loss_scale(); }

  AutocastScope autocast() { return AutocastScope(engine_); }

  // The model's parameters and buffers, full, on the main process (empty elsewhere). Every
  // rank must call it: sharded strategies gather one unit at a time to rank 0.
  template <class M>
  NamedTensors get_state_dict(const PreparedModel<M>& model) {
    return engine_->state_dict(model.index(), 0);
  }
  // This rank's shards of the model's parameters, each named "<name>@<offset>:<length>" (a
  // piece of the flattened parameter); unsharded strategies give every parameter whole.
  template <class M>
  NamedTensors get_sharded_state_dict(const PreparedModel<M>& model) {
    return engine_->state_dict(model.index(), 1);
  }

  // The module given to prepare (its members, its plain forward). Under a strategy that frees
  // parameters between forwards (zero3, fsdp FULL_SHARD) its parameters are empty shards at
  // rest, so unwrapping it then is a UsageError that names full_model and get_state_dict.
  template <class M>
  const M& unwrap_model(const PreparedModel<M>& model) const {
    engine_->check_unwrap(model.index());
    return model.module();
  }
  // A copy of the model with every parameter and buffer whole, on every rank (collective),
  // under any strategy: what torch::save, an evaluation outside the loop or an export want.
  // The module must be clonable (its Impl derives from torch::nn::Cloneable<Impl>).
  template <class M>
  M full_model(const PreparedModel<M>& model) {
    using Impl = detail::module_impl_t<M>;
    static_assert(std::is_base_of_v<torch::nn::Cloneable<Impl>, Impl>,
                  "full_model: the module must be clonable: derive its Impl from torch::nn::Cloneable<Impl> "
                  "(and build its submodules in reset()), as LibTorch's own modules do");
    auto copy = std::dynamic_pointer_cast<Impl>(detail::module_ptr(model.module())->clone());
    engine_->fill_full_copy(model.index(), *copy);
    if constexpr (torch::detail::is_module_holder<M>::value)
      return M(std::move(copy));
    else
      return copy;
  }

  // Process information.
  const ProcessInfo& process() const { return engine_->process(); }
  bool is_main_process() const { return process().is_main_process(); }
  bool is_local_main_process() const { return process().is_local_main_process(); }
  bool is_last_process() const { return process().rank == process().world_size - 1; }
  int process_index() const { return process().rank; }
  int local_process_index() const { return process().local_rank; }
  int num_processes() const { return process().world_size; }
  torch::Device device() const { return engine_->device(); }
  const Config& config() const { return engine_->config(); }
  // Debug mode at run time (Accelerate's `state.debug`; the `debug` key sets it at start):
  // before every collective the ranks check that they are all in the same one. Switch it on
  // every rank at the same point of the program, between collectives.
  void set_debug(bool enabled) { engine_->set_debug(enabled); }
  bool debug() const { return config().debug; }
  std::string mixed_precision() const { return engine_->precision_name(); }
  std::string strategy() const { return engine_->strategy_name(); }

  // Prints on the main process only.
  template <class... A>
  void print(A&&... parts) const {
    if (!is_main_process()) return;
    std::ostringstream out;
    (out << ... << parts);
    std::cout << out.str() << std::endl;
  }
  std::shared_ptr<Logger> logger(bool main_process_only = true) const {
    return get_logger("hasten", main_process_only);
  }

  // Seeds LibTorch's generators (plus the process index with device_specific).
  void set_seed(uint64_t seed, bool device_specific = false) const {
    hasten::set_seed(seed + (device_specific ? static_cast<uint64_t>(process_index()) : 0), false);
  }

  // Collectives: every rank must call them, in the same order.
  torch::Tensor gather(const torch::Tensor& tensor) { return engine_->gather(tensor); }
  // gather, then drops the samples that pad the loader's last round (exact counts): per batch
  // inside the loop, or, after a loop over a whole epoch, on the epoch's outputs concatenated
  // (one row per sample the rank was given), so each sample counts once.
  torch::Tensor gather_for_metrics(const torch::Tensor& tensor) {
    return engine_->gather_for_metrics(tensor);
  }
  // op: "sum", "mean", "max" or "min".
  torch::Tensor reduce(const torch::Tensor& tensor, const std::string& op = "sum") {
    return engine_->reduce(tensor, op);
  }
  torch::Tensor broadcast(const torch::Tensor& tensor, int from_process = 0) {
    return engine_->broadcast(tensor, from_process);
  }
  std::string broadcast(const std::string& text, int from_process = 0) {
    return engine_->broadcast(text, from_process);
  }
  torch::Tensor pad_across_processes(const torch::Tensor& tensor, int64_t dim = 0,
                                     double pad_index = 0, bool pad_first = false) {
    return engine_->pad_across_processes(tensor, dim, pad_index, pad_first);
  }
  void wait_for_everyone() { engine_->wait_for_everyone(); }
  // The run's processes as a mesh of named dimensions (config key parallelism_config) and this
  // process's group along each, for collectives over part of the run (device_mesh.hpp).
  DeviceMesh device_mesh() const { return DeviceMesh(engine_); }
  // The bytes this process has handed to collectives, within its machine and across machines
  // (comm_stats.hpp): what a sharding layout costs in traffic, HSDP's against FULL_SHARD's.
  CommStats comm_stats() const { return engine_->comm_stats(); }
  // In-place collectives on contiguous tensors (CPU tensors go to the CPU comm backend,
  // CUDA tensors to the GPU one). all_reduce_ returns at once; wait on the Work.
  Work all_reduce_(torch::Tensor& tensor, ReduceOp op = ReduceOp::Sum) {
    return Work(engine_->all_reduce_(tensor, op));
  }
  // Every rank's reduction of its equal-sized input, scattered: rank r gets slice r of size
  // numel / num_processes along dim 0.
  torch::Tensor reduce_scatter(const torch::Tensor& tensor, ReduceOp op = ReduceOp::Sum) {
    return engine_->reduce_scatter(tensor, op);
  }
  // gather and reduce_scatter into a tensor the caller owns (PyTorch's all_gather_into_tensor and
  // reduce_scatter_tensor): contiguous tensors of one dtype and device, output holding
  // num_processes x input elements (all_gather_into, rank-major) or input holding
  // num_processes x output elements (reduce_scatter_into). A loop that reuses its output pays
  // only the collective, not a fresh allocation's page faults on every call.
  void all_gather_into(torch::Tensor& output, const torch::Tensor& input) { engine_->all_gather_into(output, input); }
  void reduce_scatter_into(torch::Tensor& output, const torch::Tensor& input, ReduceOp op = ReduceOp::Sum) {
    engine_->reduce_scatter_into(output, input, op);
  }
  void broadcast_(torch::Tensor& tensor, int from_process = 0) { engine_->broadcast_(tensor, from_process); }
  // The comm plugin that carries collectives of tensors on `device` ("gloo", "local"...).
  std::string comm_backend(const torch::Device& device = torch::kCPU) const { return engine_->backend_for(device); }
  MainProcessFirst main_process_first() { return MainProcessFirst(engine_, is_main_process()); }
  // This process's contiguous share of items; the first size % N processes get one more.
  // With apply_padding every share has the same length (the last item repeats).
  template <class T>
  std::vector<T> split_between_processes(const std::vector<T>& items, bool apply_padding = false) const {
    const size_t n = static_cast<size_t>(num_processes());
    const size_t r = static_cast<size_t>(process_index());
    const size_t base = items.size() / n, extra = items.size() % n;
    const size_t begin = r * base + std::min(r, extra);
    const size_t count = base + (r < extra ? 1 : 0);
    std::vector<T> out(items.begin() + begin, items.begin() + begin + count);
    if (apply_padding && extra != 0 && count == base && !items.empty()) out.push_back(items.back());
    return out;
  }
  // A flag any rank can raise and every rank sees at the next check_trigger() (collective);
  // stop_requested(): SIGTERM or SIGUSR1 reached a rank since its first call (docs/api.md).
  void set_trigger() { engine_->set_trigger(); }
  bool check_trigger() { return engine_->check_trigger(); }
  bool stop_requested() { return engine_->stop_requested(); }
  // --- Accelerate's object collectives, nested collectives, splits, RNG sync and run-on
  // helpers (hasten/object_collectives.hpp, nested.hpp, run_on.hpp) ---
  // Every rank's object: a std::vector gives every rank's elements concatenated in rank order
  // (Accelerate's gather_object on a list); any other value gives a vector of every rank's
  // object. Values are anything hasten::Serializer writes (hasten/serialization.hpp: numbers,
  // strings, tensors, vectors, maps, tuples..., and your own types by specialising it).
  template <class T>
  auto gather_object(const T& object) {
    return detail::gather_object(*engine_, object);
  }
  // Replaces `list` on every rank with from_process's list (its length too); returns it.
  template <class T, class A>
  std::vector<T, A>& broadcast_object_list(std::vector<T, A>& list, int from_process = 0) {
    return detail::broadcast_object_list(*engine_, list, from_process);
  }
  // gather, gather_for_metrics, reduce, broadcast and pad_across_processes on a nested
  // structure of tensors (vectors, arrays, pairs, tuples, maps, unordered maps, in any depth):
  // the same structure back, the collective applied to each tensor (Accelerate's
  // recursively_apply). Maps are visited by key, so every rank must pass the same keys.
  template <class T, std::enable_if_t<detail::is_nested_v<T>, int> = 0>
  T gather(const T& data) {
    return detail::on_tensor_leaves(data, [this](const torch::Tensor& t) { return engine_->gather(t); });
  }
  // A std::vector of values that are not tensors (one per sample: strings, numbers...) is
  // gathered as objects, less the same padding samples (Accelerate's gather_object path).
  template <class T, std::enable_if_t<detail::is_nested_v<T>, int> = 0>
  T gather_for_metrics(const T& data) {
    if constexpr (detail::is_std_vector<T>::value && !detail::has_tensor_leaves_v<T>)
      return detail::gather_objects_for_metrics(*engine_, data);
    else
      return detail::on_tensor_leaves(data, [this](const torch::Tensor& t) { return engine_->gather_for_metrics(t); });
  }
  template <class T, std::enable_if_t<detail::is_nested_v<T>, int> = 0>
  T reduce(const T& data, const std::string& op = "sum") {
    return detail::on_tensor_leaves(data, [this, &op](const torch::Tensor& t) { return engine_->reduce(t, op); });
  }
  template <class T, std::enable_if_t<detail::is_nested_v<T>, int> = 0>
  T broadcast(const T& data, int from_process = 0) {
    return detail::on_tensor_leaves(data, [this, from_process](const torch::Tensor& t) { return engine_->broadcast(t, from_process); });
  }
  template <class T, std::enable_if_t<detail::is_nested_v<T>, int> = 0>
  T pad_across_processes(const T& data, int64_t dim = 0, double pad_index = 0, bool pad_first = false) {
    return detail::on_tensor_leaves(data, [this, dim, pad_index, pad_first](const torch::Tensor& t) {
      return engine_->pad_across_processes(t, dim, pad_index, pad_first);
    });
  }
  // split_between_processes on a tensor: this process's rows along dim 0 (a view), with
  // Accelerate's arithmetic; with apply_padding every share has the same number of rows (the
  // input's last row repeats). On a map (std::map or std::unordered_map) of tensors, vectors
  // or such maps: every value split the same way; all must have the same length.
  torch::Tensor split_between_processes(const torch::Tensor& tensor, bool apply_padding = false) const {
    const auto range = detail::split_range(detail::split_length(tensor), num_processes(), process_index());
    return detail::split_take(tensor, range, apply_padding);
  }
  template <class Map, std::enable_if_t<detail::is_splittable_map<Map>::value, int> = 0>
  Map split_between_processes(const Map& values, bool apply_padding = false) const {
    static_assert(detail::split_values_ok<Map>::value,
                  "split_between_processes: a map's values must be tensors, std::vectors or maps of them");
    const auto range = detail::split_range(detail::split_length_of_map(values), num_processes(), process_index());
    return detail::split_take(values, range, apply_padding);
  }
  // Sets every rank's generators to rank 0's (Accelerate's synchronize_rng_states): "torch"
  // (LibTorch's default CPU generator), "cuda" (the default generator of this process's CUDA
  // device), "generator" (`generator`). Collective.
  void synchronize_rng_states(const std::vector<std::string>& rng_types, torch::Generator generator = {}) {
    engine_->synchronize_rng_states(rng_types, std::move(generator));
  }
  // Wrap fn so that calling it runs fn only on that process (hasten/run_on.hpp): void stays
  // void, a result R comes back as std::optional<R>, empty elsewhere.
  template <class F>
  RunOn<std::decay_t<F>> on_main_process(F&& fn) const {
    return {std::forward<F>(fn), is_main_process()};
  }
  template <class F>
  RunOn<std::decay_t<F>> on_local_main_process(F&& fn) const {
    return {std::forward<F>(fn), is_local_main_process()};
  }
  template <class F>
  RunOn<std::decay_t<F>> on_last_process(F&& fn) const {
    return {std::forward<F>(fn), is_last_process()};
  }
  template <class F>
  RunOn<std::decay_t<F>> on_process(F&& fn, int process_index) const {
    detail::check_process_index("on_process", process_index, num_processes());
    return {std::forward<F>(fn), process_index == this->process_index()};
  }
  template <class F>
  RunOn<std::decay_t<F>> on_local_process(F&& fn, int local_process_index) const {
    detail::check_process_index("on_local_process", local_process_index, process().local_world_size);
    return {std::forward<F>(fn), local_process_index == this->local_process_index()};
  }
  // --- end of that block ---

  // Checkpoints (docs/checkpoints.md); every rank calls them. save_state writes the prepared
  // models (safetensors), optimizers, schedulers, data loader positions, the accumulation
  // state, each rank's RNG and the registered objects into `output_dir` atomically, or, with
  // no directory (or automatic_checkpoint_naming), into
  // <project_dir>/checkpoints/checkpoint_<save_iteration()>; it returns the directory.
  // load_state reads one back (no directory: the newest complete checkpoint, skipping damaged
  // ones with a warning) so that the loop continues exactly where it stopped, mid-epoch
  // included. Call it after prepare and before training.
  std::string save_state(const std::string& output_dir = "") { return engine_->save_state(output_dir); }
  std::string load_state(const std::string& input_dir = "") { return engine_->load_state(input_dir); }
  // Run on every rank at the start of save_state / load_state, in registration order; a hook
  // may take models out of StateHookArgs::models and save or load them itself.
  HookHandle register_save_state_pre_hook(StateHook hook) { return state_pre_hook(true, std::move(hook)); }
  HookHandle register_load_state_pre_hook(StateHook hook) { return state_pre_hook(false, std::move(hook)); }
  // The model's full weights for other tools (docs/checkpoints.md): dir/model.safetensors,
  // or shards of at most max_shard_size ("10GB", "500MB") with model.safetensors.index.json,
  // Hugging Face's layout; sharded strategies gather one unit at a time. Every rank calls it;
  // rank 0 writes. hasten::load_weights (hasten/weights.hpp) reads them back into a module.
  template <class M>
  void save_model(const PreparedModel<M>& model, const std::string& dir, const std::string& max_shard_size = "10GB") {
    engine_->save_model(model.index(), dir, parse_size(max_shard_size));
  }
  // Config `resume` (docs/checkpoints.md): `auto` continues from the newest complete
  // checkpoint under <project_dir>/checkpoints when there is one, a directory from that one,
  // `no` (the default) starts fresh. It applies once, when the loop starts (a prepared
  // loader's first epoch or a prepared model's first call; prepare and register everything
  // before) or at the first call of resumed_from(), which returns the checkpoint the run
  // continued from ("" when it started fresh). Every rank calls it.
  std::string resumed_from() { return engine_->resume(); }
  // The number the next automatic checkpoint gets (continues after load_state).
  int64_t save_iteration() const { return engine_->save_iteration(); }
  // Adds an object to every checkpoint. It has `state_dict()` returning either std::string
  // (bytes) or hasten::NamedTensors, and the matching `load_state_dict(const ...&)`; it must
  // outlive the Accelerator's checkpoints. Register in the same order before save and load.
  template <class T>
  void register_for_checkpointing(T& object) {
    engine_->register_for_checkpointing(detail::Engine::checkpoint_object(object));
  }

  // Trackers (config key `trackers`), on the main process only.
  // init_kwargs: Accelerate's, per tracker its options ({{"mlflow", "{run_name: baseline}"}}).
  void init_trackers(const std::string& project, const Hparams& hparams = {}, const TrackerKwargs& init_kwargs = {}) {
    engine_->init_trackers(project, hparams, init_kwargs);
  }
  void log(const Metrics& values, int64_t step = -1) { engine_->log(values, step); }
  // A running tracker by name: what names its run (mlflow's run_id, tensorboard's log_dir) and
  // a log to it alone; a blank handle on other processes; UsageError for a name not running.
  TrackerHandle get_tracker(const std::string& name) { return engine_->get_tracker(name, engine_); }
  // A text entry (a sample, a note) for the trackers that keep text; the others skip it.
  void log_text(const std::string& name, const std::string& text, int64_t step = -1) { engine_->log_text(name, text, step); }
  // Images for the trackers that keep them (the others: one line, once): [H, W], [C, H, W] or
  // [H, W, C], C 1, 3 or 4 (CHW where both fit), uint8 or floating 0-1 (tracker_media.cpp).
  void log_images(const std::vector<std::pair<std::string, torch::Tensor>>& images, int64_t step = -1) {
    engine_->log_images(images, step);
  }
  // A histogram of the values' finite elements (weights, gradients: any tensor, on any device).
  void log_histogram(const std::string& name, const torch::Tensor& values, int64_t step = -1) { engine_->log_histogram(name, values, step); }
  // Accelerate's log_table: named columns, rows of text or number cells.
  void log_table(const std::string& name, const std::vector<std::string>& columns,
                 const std::vector<std::vector<TableCell>>& rows, int64_t step = -1) { engine_->log_table(name, columns, rows, step); }
  void end_training() { engine_->end_training(); }
  // LibTorch's profiler over the optimizer steps from now: `wait` and `warmup` steps, then
  // `active` ones recorded on every rank into <dir>/<host>_rank<R>.pt.trace.json (config key profile).
  void profile(const ProfileSettings& window) { engine_->profile(window); }

 private:
  HookHandle state_pre_hook(bool save, StateHook hook) {
    if (!hook) throw UsageError(std::string("register_") + (save ? "save" : "load") + "_state_pre_hook: the hook is empty");
    const size_t id = engine_->add_state_pre_hook(save, std::move(hook));
    return HookHandle([engine = std::weak_ptr<detail::Engine>(engine_), id] {
      if (auto e = engine.lock()) e->remove_state_pre_hook(id);
    });
  }

  std::shared_ptr<detail::Engine> engine_;
};

}  // namespace hasten
