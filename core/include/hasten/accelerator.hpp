// hasten::Accelerator: a plain LibTorch training loop, four changes away from running on
// one CPU, many processes or many machines.
//
//   hasten::Accelerator acc;                                  // defaults < file < env < code
//   auto [model, opt, loader, sched] = acc.prepare(net, optimizer, data, scheduler);
//   for (auto& batch : loader) {
//     auto step = acc.accumulate(model);                      // decides sync for this batch
//     auto loss = torch::nn::functional::cross_entropy(model(batch.input), batch.target);
//     acc.backward(loss);
//     if (acc.sync_gradients()) acc.clip_grad_norm_(model, 1.0);
//     opt.step(); sched.step(); opt.zero_grad();              // no-ops while accumulating
//   }
//   acc.end_training();
//
// Prepared objects share the Accelerator's state and stay valid after it goes out of scope.
#pragma once

#include <hasten/config.hpp>
#include <hasten/data.hpp>
#include <hasten/detail/engine.hpp>
#include <hasten/error.hpp>
#include <hasten/logging.hpp>
#include <hasten/process.hpp>
#include <hasten/safetensors.hpp>
#include <hasten/unit.hpp>

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

class Accelerator;

using HparamValue = std::variant<bool, int64_t, double, std::string>;
using Hparams = std::vector<std::pair<std::string, HparamValue>>;
using Metrics = std::vector<std::pair<std::string, double>>;

namespace detail {

// Outputs of a mixed-precision forward come back as float32, as Accelerate does.
inline torch::Tensor to_float_output(const torch::Tensor& t) {
  if (t.defined() && (t.scalar_type() == torch::kBFloat16 || t.scalar_type() == torch::kHalf))
    return t.to(torch::kFloat);
  return t;
}
template <class T>
T to_float_outputs(T&& value) {
  using D = std::decay_t<T>;
  if constexpr (std::is_same_v<D, torch::Tensor>) {
    return to_float_output(value);
  } else if constexpr (std::is_same_v<D, std::vector<torch::Tensor>>) {
    for (auto& t : value) t = to_float_output(t);
    return std::forward<T>(value);
  } else {
    return std::forward<T>(value);
  }
}

// The autocast region of one forward call.
class AutocastGuard {
 public:
  explicit AutocastGuard(Engine& engine) : engine_(&engine), token_(engine.autocast_enter()) {}
  ~AutocastGuard() { engine_->autocast_exit(token_); }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  Engine* engine_;
  void* token_;
};

template <class T>
struct is_shared_ptr : std::false_type {};
template <class T>
struct is_shared_ptr<std::shared_ptr<T>> : std::true_type {};

template <class T>
struct is_data_loader : std::false_type {};
template <class D>
struct is_data_loader<DataLoader<D>> : std::true_type {};

template <class T>
struct pointee {
  using type = T;
};
template <class T>
struct pointee<std::shared_ptr<T>> {
  using type = T;
};

template <class T>
using bare_t = typename pointee<std::decay_t<T>>::type;

template <class T>
constexpr bool is_model_v =
    torch::detail::is_module_holder<std::decay_t<T>>::value ||
    (is_shared_ptr<std::decay_t<T>>::value && std::is_base_of_v<torch::nn::Module, bare_t<T>>);
template <class T>
constexpr bool is_optimizer_v = std::is_base_of_v<torch::optim::Optimizer, bare_t<T>>;
template <class T>
constexpr bool is_scheduler_v = std::is_base_of_v<torch::optim::LRScheduler, bare_t<T>>;
template <class T>
constexpr bool is_loader_v = is_data_loader<std::decay_t<T>>::value;

template <class M>
std::shared_ptr<torch::nn::Module> module_ptr(const M& model) {
  if constexpr (torch::detail::is_module_holder<M>::value)
    return model.ptr();
  else
    return model;
}

}  // namespace detail

// An asynchronous collective: wait() blocks until it completes and throws hasten::Error if
// it failed (a dead or hung peer, a timeout).
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<detail::PendingWork> pending) : pending_(std::move(pending)) {}
  void wait();
  bool is_completed();

 private:
  std::shared_ptr<detail::PendingWork> pending_;
};

// A model after prepare: call it like the module (autocast and the strategy's hooks wrap
// the forward); `->` reaches the module's members.
template <class M>
class PreparedModel {
 public:
  using module_type = M;
  PreparedModel(M module, std::shared_ptr<detail::Engine> engine, size_t index)
      : module_(std::move(module)), engine_(std::move(engine)), index_(index) {}

  template <class... Args>
  decltype(auto) operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }
  template <class... Args>
  auto forward(Args&&... args) {
    detail::AutocastGuard guard(*engine_);
    if (!engine_->unit_events()) return detail::to_float_outputs(module_->forward(std::forward<Args>(args)...));
    // A sharding strategy: unit 0 (the model's own parameters) around the whole forward.
    engine_->model_forward_enter(index_);
    try {
      auto out = module_->forward(std::forward<Args>(args)...);
      std::vector<torch::Tensor> outputs;
      detail::outputs_of(out, outputs);
      engine_->model_forward_exit(index_, outputs);
      return detail::to_float_outputs(std::move(out));
    } catch (const hasten::Error&) {
      throw;
    } catch (const std::exception& e) {
      engine_->forward_failed(index_, e);
    }
  }
  auto operator->() const { return module_.get(); }
  // The user's module, as passed to prepare (hasten::Accelerator::unwrap_model does the same).
  const M& module() const { return module_; }
  size_t index() const { return index_; }
  std::vector<torch::Tensor> parameters() const { return module_->parameters(); }
  void train(bool on = true) { module_->train(on); }
  void eval() { module_->eval(); }

 private:
  M module_;
  std::shared_ptr<detail::Engine> engine_;
  size_t index_;
};

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

// A learning-rate scheduler after prepare: step() advances the schedule once per real
// optimizer step (not on accumulation micro-batches, not when the step was skipped), unless
// step_scheduler_with_optimizer is false.
template <class S>
class PreparedScheduler {
 public:
  PreparedScheduler(std::shared_ptr<S> scheduler, std::shared_ptr<detail::Engine> engine)
      : scheduler_(std::move(scheduler)), engine_(std::move(engine)) {}
  void step() {
    if (engine_->scheduler_should_step()) scheduler_->step();
  }
  S& scheduler() const { return *scheduler_; }
  S* operator->() const { return scheduler_.get(); }

 private:
  std::shared_ptr<S> scheduler_;
  std::shared_ptr<detail::Engine> engine_;
};

// A data loader after prepare: this rank's share of each epoch's global order.
template <class Dataset>
class PreparedDataLoader {
  // Marks the loader active while an iteration is under way (for end-of-data detection).
  struct Session {
    Session(std::shared_ptr<detail::Engine> e, size_t l) : engine(std::move(e)), loader(l) {}
    ~Session() { engine->loader_end(loader); }
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;
    std::shared_ptr<detail::Engine> engine;
    size_t loader;
  };

 public:
  PreparedDataLoader(std::shared_ptr<Dataset> dataset, std::shared_ptr<detail::Engine> engine,
                     size_t loader, torch::Device device)
      : dataset_(std::move(dataset)), engine_(std::move(engine)), loader_(loader), device_(device) {}

  using iterator = detail::BatchIterator<Dataset>;

  // Each call starts the next epoch.
  iterator begin() {
    auto plan = engine_->loader_begin_epoch(loader_);
    end_pos_ = plan.num_batches;
    auto session = plan.num_batches > 0 ? std::make_shared<Session>(engine_, loader_)
                                        : nullptr;
    if (!session) engine_->loader_end(loader_);
    auto observer = [engine = engine_, id = loader_](int64_t batch, int64_t n, int64_t padding) {
      engine->loader_at(id, batch, n, padding);
    };
    return iterator(dataset_, std::move(plan), 0, device_, std::move(observer), std::move(session));
  }
  iterator end() { return iterator(nullptr, {}, end_pos_); }
  // Batches per epoch on this rank.
  size_t size() const { return static_cast<size_t>(engine_->loader_num_batches(loader_)); }
  Dataset& dataset() const { return *dataset_; }

 private:
  std::shared_ptr<Dataset> dataset_;
  std::shared_ptr<detail::Engine> engine_;
  size_t loader_;
  torch::Device device_;
  int64_t end_pos_ = 0;
};

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
    if (main_) engine_->wait_for_everyone();
  }
  MainProcessFirst(const MainProcessFirst&) = delete;
  MainProcessFirst& operator=(const MainProcessFirst&) = delete;

 private:
  std::shared_ptr<detail::Engine> engine_;
  bool main_;
};

namespace detail {
template <class T>
struct prepared;
}  // namespace detail

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
  //   scheduler: an lvalue torch::optim::LRScheduler or a shared_ptr -> PreparedScheduler<S>
  // Models are prepared first, so the strategy sees every model before any optimizer.
  template <class... T>
  auto prepare(T&&... objects) {
    static_assert(sizeof...(T) > 0, "prepare() needs at least one object");
    (check_preparable<T>(), ...);
    (prepare_model_pass(objects), ...);
    std::tuple<typename detail::prepared<T>::type...> out{prepare_one(std::forward<T>(objects))...};
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

  template <class M>
  const M& unwrap_model(const PreparedModel<M>& model) const {
    return model.module();
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
  std::shared_ptr<spdlog::logger> logger(bool main_process_only = true) const {
    return get_logger("hasten", main_process_only);
  }

  // Seeds LibTorch's generators (plus the process index with device_specific).
  void set_seed(uint64_t seed, bool device_specific = false) const;

  // Collectives: every rank must call them, in the same order.
  torch::Tensor gather(const torch::Tensor& tensor) { return engine_->gather(tensor); }
  // gather, then drops the samples that pad the loader's last round (exact counts).
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
  // A flag any rank can raise and every rank sees at the next check_trigger() (collective).
  void set_trigger() { engine_->set_trigger(); }
  bool check_trigger() { return engine_->check_trigger(); }

  // Trackers (config key `trackers`), on the main process only.
  void init_trackers(const std::string& project, const Hparams& hparams = {});
  void log(const Metrics& values, int64_t step = -1) { engine_->log(values, step); }
  // A text entry (a sample, a note) for the trackers that keep text; the others skip it.
  void log_text(const std::string& name, const std::string& text, int64_t step = -1) {
    engine_->log_text(name, text, step);
  }
  void end_training() { engine_->end_training(); }

 private:
  template <class T>
  static constexpr void check_preparable() {
    static_assert(detail::is_model_v<T> || detail::is_optimizer_v<T> || detail::is_scheduler_v<T> ||
                      detail::is_loader_v<T>,
                  "prepare() takes models (shared_ptr<Module> or module holders), optimizers, "
                  "schedulers and hasten::DataLoader objects");
    if constexpr ((detail::is_optimizer_v<T> || detail::is_scheduler_v<T>) &&
                  !detail::is_shared_ptr<std::decay_t<T>>::value)
      static_assert(std::is_lvalue_reference_v<T>,
                    "pass optimizers and schedulers as lvalues (you keep them alive) or as "
                    "shared_ptr");
  }

  template <class T>
  void prepare_model_pass(T& object) {
    if constexpr (detail::is_model_v<T>) {
      auto ptr = detail::module_ptr(object);
      if (!engine_->find_model(ptr.get())) engine_->add_model(ptr);
    }
  }

  template <class T>
  typename detail::prepared<T>::type prepare_one(T&& object) {
    using D = std::decay_t<T>;
    if constexpr (detail::is_model_v<T>) {
      auto ptr = detail::module_ptr(object);
      return PreparedModel<D>(object, engine_, *engine_->find_model(ptr.get()));
    } else if constexpr (detail::is_optimizer_v<T>) {
      if constexpr (detail::is_shared_ptr<D>::value)
        return PreparedOptimizer(engine_, engine_->add_optimizer(*object, object));
      else
        return PreparedOptimizer(engine_, engine_->add_optimizer(object, nullptr));
    } else if constexpr (detail::is_scheduler_v<T>) {
      engine_->add_scheduler();
      using S = detail::bare_t<T>;
      if constexpr (detail::is_shared_ptr<D>::value)
        return PreparedScheduler<S>(object, engine_);
      else  // borrowed: the caller keeps it alive
        return PreparedScheduler<S>(std::shared_ptr<S>(std::shared_ptr<S>(), &object), engine_);
    } else {
      using Dataset = typename D::dataset_type;
      const size_t id = engine_->add_loader(static_cast<int64_t>(object.dataset_size()),
                                            object.options());
      return PreparedDataLoader<Dataset>(object.dataset_ptr(), engine_, id, engine_->device());
    }
  }

  std::shared_ptr<detail::Engine> engine_;
};

namespace detail {
template <class T>
struct tag {
  using type = T;
};
template <class T>
struct prepared {
  using D = std::decay_t<T>;
  static auto pick() {
    if constexpr (is_model_v<T>)
      return tag<PreparedModel<D>>{};
    else if constexpr (is_optimizer_v<T>)
      return tag<PreparedOptimizer>{};
    else if constexpr (is_scheduler_v<T>)
      return tag<PreparedScheduler<bare_t<T>>>{};
    else if constexpr (is_loader_v<T>)
      return tag<PreparedDataLoader<typename D::dataset_type>>{};
    else
      return tag<void>{};
  }
  using type = typename decltype(pick())::type;
};
}  // namespace detail

// Seeds LibTorch's generators on this process (plus its rank with device_specific).
void set_seed(uint64_t seed, bool device_specific = false);

}  // namespace hasten
