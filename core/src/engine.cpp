// The Accelerator's engine: configuration, the plugin instances of the run, the gradient
// accumulation state machine, the wrappers' step logic, collectives on tensors and trackers.
#define HASTEN_PLUGIN_TORCH_TIER 1
#include <hasten/accelerator.hpp>
#include <hasten/detail/engine.hpp>
#include <hasten/error.hpp>
#include <hasten/logging.hpp>
#include <hasten/plugin.hpp>
#include <hasten/registry.hpp>
#include <hasten/torch_compat.hpp>

#include <nlohmann/json.hpp>
#include <torch/cuda.h>
#include <torch/nn/utils/clip_grad.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include "comm_instance.hpp"
#include "comm_routing.hpp"
#include "communicator.hpp"
#include "host_api.hpp"
#include "plugin_communicator.hpp"
#include "rendezvous.hpp"
#include "precision_instance.hpp"
#include "strategy_instance.hpp"
#include "tracker_instance.hpp"

namespace fs = std::filesystem;

namespace hasten::detail {

namespace {

struct ModelEntry {
  std::shared_ptr<torch::nn::Module> module;
  bool sync_enabled = true;  // what the strategy was last told
  std::vector<UnitBase*> units;  // nested hasten::Unit modules (1..n), attached to this engine
  bool root_is_unit = false;     // the model is itself a hasten::Unit (its forward reports unit 0)
};

struct OptimizerEntry {
  torch::optim::Optimizer* optimizer = nullptr;
  std::shared_ptr<void> owner;
  bool last_skipped = false;
};

struct LoaderEntry {
  ShardSpec spec;
  int64_t epoch = 0;
  int64_t num_batches = 0;
};

struct ActiveLoader {
  size_t id = 0;
  int64_t batch = -1;
  int64_t num_batches = 0;
  int64_t num_padding = 0;
};

std::string describe(const torch::Tensor& t) {
  if (!t.defined()) return "(no tensor)";
  std::string s = std::string(c10::toString(t.scalar_type())) + "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

hasten_reduce_op to_abi(ReduceOp op) { return static_cast<hasten_reduce_op>(static_cast<int>(op)); }

hasten_reduce_op reduce_op(const std::string& op) {
  if (op == "sum" || op == "mean") return HASTEN_REDUCE_SUM;
  if (op == "max") return HASTEN_REDUCE_MAX;
  if (op == "min") return HASTEN_REDUCE_MIN;
  throw UsageError("reduce: operation '" + op + "' is not allowed (allowed: sum, mean, max, min)");
}

}  // namespace

struct PendingWork {
  WorkPtr work;
  torch::Tensor keep_alive;  // the buffer must outlive the operation
  int64_t timeout_ms = 0;
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
  std::vector<std::unique_ptr<TrackerInstance>> trackers;
  std::vector<ModelEntry> models;
  std::vector<OptimizerEntry> optimizers;
  size_t schedulers = 0;
  std::vector<LoaderEntry> loaders;
  std::vector<ActiveLoader> active;  // innermost loader last

  // Gradient accumulation state.
  bool sync = true;
  int64_t accum_step = 0;
  int64_t window = 1;  // micro-batches in the current accumulation window
  int accumulate_depth = 0;
  bool trigger = false;

  const ActiveLoader* innermost() const { return active.empty() ? nullptr : &active.back(); }
  bool end_of_dataloader() const {
    auto* a = innermost();
    return a != nullptr && a->batch >= 0 && a->batch == a->num_batches - 1;
  }

  Communicator& communicator() { return *comm; }

  // Tensor-level collectives over the communicator.
  void allreduce_(torch::Tensor& t, hasten_reduce_op op) {
    DLTensor view = sdk::dl_view(t);
    if (auto work = comm->allreduce(view, op, nullptr)) work->wait(0);
  }

  // Debug mode: before a collective, every rank publishes what it is about to do and checks
  // that all ranks agree, so a mismatch is an error naming the ranks instead of a hang.
  void check_collective(const std::string& op, const torch::Tensor& t) {
    if (!config.debug || process.world_size == 1) return;
    const int64_t n = collective_seq++;
    const std::string mine = op + " " + describe(t);
    const std::string key = "hasten/debug/" + std::to_string(n) + "/";
    store->set(key + std::to_string(process.rank), std::vector<uint8_t>(mine.begin(), mine.end()));
    std::vector<std::string> differ;
    std::string all;
    for (int r = 0; r < process.world_size; ++r) {
      std::string theirs;
      try {
        auto v = store->get(key + std::to_string(r), host.timeout_ms);
        theirs.assign(v.begin(), v.end());
      } catch (const Error&) {
        throw UsageError("debug: rank " + std::to_string(r) + " did not reach collective #" + std::to_string(n) +
                         " (rank " + std::to_string(process.rank) + " is in " + mine + ") within " +
                         std::to_string(config.timeout_s) + " s");
      }
      all += (r ? "; " : "") + std::string("rank ") + std::to_string(r) + ": " + theirs;
      if (theirs != mine) differ.push_back(std::to_string(r));
    }
    if (!differ.empty())
      throw UsageError("debug: ranks disagree on collective #" + std::to_string(n) + " (" + all + ")");
  }
};

Engine::Engine(const Options& options) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.config = resolve_config(options);
  set_log_level(s.config.log_level);
  s.process = detect_process_info(current_environment());
  if (!s.config.plugin_path.empty())
    PluginRegistry::instance().add_search_directories(s.config.plugin_path);

  if (!s.config.use_cpu && torch::cuda::is_available()) {
    const int count = static_cast<int>(torch::cuda::device_count());
    s.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(s.process.local_rank % count));
    s.dl_device = {kDLCUDA, s.process.local_rank % count};
  }

  s.host.process = s.process;
  s.host.timeout_ms = static_cast<int64_t>(s.config.timeout_s * 1000.0);
  auto& registry = PluginRegistry::instance();
  if (s.process.world_size > 1) {
    s.store = rendezvous(s.process, s.host.timeout_ms);
    s.host.store = s.store.get();
    // One backend per device type the run touches (comm_routing.cpp: the config, or the
    // plugins' own declarations under auto). comm_options go to the CPU backend.
    auto backend = [&](int32_t type) {
      auto it = s.config.comm_backends.find(type == kDLCUDA ? "cuda" : "cpu");
      return it == s.config.comm_backends.end() ? std::string("auto") : it->second;
    };
    auto cpu = open_comm_backend(kDLCPU, backend(kDLCPU), s.config.comm_options, &s.host.api, s.process,
                                 s.host.timeout_ms);
    std::unique_ptr<CommInstance> gpu;
    if (s.dl_device.device_type == kDLCUDA)
      gpu = open_comm_backend(kDLCUDA, backend(kDLCUDA), "{}", &s.host.api, s.process, s.host.timeout_ms);
    s.comm = make_plugin_communicator(s.process.rank, s.process.world_size, std::move(cpu), std::move(gpu));
  } else {
    s.comm = make_local_communicator();
  }
  s.host.comm = s.comm.get();

  s.strategy = std::make_unique<StrategyInstance>(
      registry.select(PluginKind::Strategy, s.config.strategy), &s.host.api,
      s.config.strategy_options);
  s.precision = std::make_unique<PrecisionInstance>(
      registry.select(PluginKind::Precision, s.config.precision), &s.host.api,
      s.config.precision_options);
  s.precision->check_device(s.dl_device);
  s.precision_autocast = s.precision->has_autocast();
  s.unit_events = s.strategy->has_unit_events();
  get_logger()->debug("accelerator: strategy {}, precision {}, device {}, rank {}/{}",
                      s.strategy->name(), s.precision->name(), s.device.str(), s.process.rank,
                      s.process.world_size);
}

Engine::~Engine() {
  // Units outlive the engine when the user keeps the model: detach them first.
  for (auto& m : impl_->models)
    for (UnitBase* u : m.units) u->engine_ = nullptr;
  // Trackers flush in destroy(); plugins go before the communicator they may use, and the
  // communicator before the store it rendezvoused through.
  impl_->trackers.clear();
  impl_->precision.reset();
  impl_->strategy.reset();
  impl_->host.comm = nullptr;
  impl_->comm.reset();
  impl_->host.store = nullptr;
  impl_->store.reset();
}

const Config& Engine::config() const { return impl_->config; }
const ProcessInfo& Engine::process() const { return impl_->process; }
torch::Device Engine::device() const { return impl_->device; }
std::string Engine::strategy_name() const { return impl_->strategy->name(); }
std::string Engine::precision_name() const { return impl_->precision->name(); }

// ---- models -------------------------------------------------------------------------------

size_t Engine::add_model(std::shared_ptr<torch::nn::Module> module) {
  Impl& s = *impl_;
  if (!module) throw UsageError("prepare: the model is null");
  const size_t index = s.models.size();
  hasten_model_info info{};
  info.struct_size = sizeof(info);
  info.abi_version = HASTEN_ABI_VERSION;
  info.index = static_cast<uint32_t>(index);
  info.device = s.dl_device;
  bool train = false;
  for (auto& p : module->parameters()) train = train || p.requires_grad();
  info.train = train ? 1 : 0;
  // Units: the model itself first, then every nested hasten::Unit in modules() order.
  ModelEntry entry;
  entry.module = module;
  std::vector<hasten_module*> units{reinterpret_cast<hasten_module*>(module.get())};
  entry.root_is_unit = dynamic_cast<UnitBase*>(module.get()) != nullptr;
  for (auto& m : module->modules(/*include_self=*/false)) {
    if (auto* u = dynamic_cast<UnitBase*>(m.get())) {
      if (u->engine_ != nullptr && u->engine_ != this)
        throw UsageError("prepare: a hasten::Unit of this model is already prepared by another Accelerator");
      entry.units.push_back(u);
      units.push_back(reinterpret_cast<hasten_module*>(m.get()));
    }
  }
  info.units = units.data();
  info.n_units = static_cast<uint32_t>(units.size());
  s.strategy->prepare_model(*module, info);
  if (s.unit_events) {
    uint32_t k = 1;
    for (UnitBase* u : entry.units) {
      u->engine_ = this;
      u->model_ = index;
      u->unit_ = k++;
    }
    if (auto* root = dynamic_cast<UnitBase*>(module.get())) {
      root->engine_ = this;
      root->model_ = index;
      root->unit_ = 0;
    }
  }
  s.models.push_back(std::move(entry));
  return index;
}

bool Engine::unit_events() const { return impl_->unit_events; }

void Engine::model_forward_enter(size_t model) {
  ModelEntry& m = impl_->models.at(model);
  if (impl_->unit_events && !m.root_is_unit) impl_->strategy->unit_pre_forward(*m.module, 0);
}

void Engine::model_forward_exit(size_t model, std::vector<torch::Tensor>& outputs) {
  ModelEntry& m = impl_->models.at(model);
  if (impl_->unit_events && !m.root_is_unit) impl_->strategy->unit_post_forward(*m.module, 0, outputs);
}

void Engine::unit_enter(size_t model, uint32_t unit) {
  impl_->strategy->unit_pre_forward(*impl_->models.at(model).module, unit);
}

void Engine::unit_exit(size_t model, uint32_t unit, std::vector<torch::Tensor>& outputs) {
  impl_->strategy->unit_post_forward(*impl_->models.at(model).module, unit, outputs);
}

void Engine::forward_failed(size_t model, const std::exception& error) {
  (void)model;
  const std::string what = error.what();
  // A bypassed unit under a parameter-sharding strategy finds its parameters empty.
  throw UsageError("the forward of a prepared model failed under strategy '" + impl_->strategy->name() +
                   "', which frees the parameters of units between uses: if a hasten::Unit was called through a "
                   "base-class pointer or an AnyModule built from its base type, call it through its Unit type. "
                   "LibTorch said: " + what.substr(0, what.find('\n')));
}

std::vector<std::pair<std::string, torch::Tensor>> Engine::state_dict(size_t model, int kind) {
  Impl& s = *impl_;
  ModelEntry& m = s.models.at(model);
  if (s.strategy->has_state_dict()) return s.strategy->state_dict(*m.module, kind);
  std::vector<std::pair<std::string, torch::Tensor>> out;
  if (kind == 0 && !s.process.is_main_process()) return out;
  torch::NoGradGuard no_grad;
  for (auto& named : m.module->named_parameters()) {
    torch::Tensor t = named.value().detach().clone();
    if (kind == 0)
      out.emplace_back(named.key(), t);
    else
      out.emplace_back(named.key() + "@0:" + std::to_string(t.numel()), t.reshape(-1));
  }
  if (kind == 0)
    for (auto& named : m.module->named_buffers()) out.emplace_back(named.key(), named.value().detach().clone());
  return out;
}

MemoryReport Engine::memory_report() {
  Impl& s = *impl_;
  MemoryReport r;
  if (s.strategy->has_memory_report()) {
    const hasten_memory_report m = s.strategy->memory_report();
    r.params = m.params, r.param_shards = m.param_shards, r.grads = m.grads, r.optimizer = m.optimizer;
    r.peak_params = m.peak_params, r.peak_param_shards = m.peak_param_shards;
    r.peak_grads = m.peak_grads, r.peak_optimizer = m.peak_optimizer;
    return r;
  }
  // Unsharded: every rank holds the whole models, their gradients and optimizer states.
  std::set<const void*> seen;
  for (auto& m : s.models) {
    for (auto& p : m.module->parameters()) {
      if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
      r.params += static_cast<uint64_t>(p.numel()) * p.element_size();
      if (p.grad().defined()) r.grads += static_cast<uint64_t>(p.grad().numel()) * p.grad().element_size();
    }
  }
  for (auto& o : s.optimizers) r.optimizer += sdk::optimizer_state_bytes(*o.optimizer);
  r.peak_params = r.params, r.peak_grads = r.grads, r.peak_optimizer = r.optimizer;
  return r;
}

std::optional<size_t> Engine::find_model(const torch::nn::Module* module) const {
  for (size_t i = 0; i < impl_->models.size(); ++i)
    if (impl_->models[i].module.get() == module) return i;
  return std::nullopt;
}

void* Engine::autocast_enter() {
  if (!impl_->precision_autocast) return nullptr;
  return impl_->precision->autocast_enter(impl_->dl_device);
}

void Engine::autocast_exit(void* token) noexcept {
  if (!impl_->precision_autocast) return;
  try {
    impl_->precision->autocast_exit(token);
  } catch (const std::exception& e) {
    get_logger()->error("{}", e.what());
  }
}

// ---- optimizers and schedulers ------------------------------------------------------------

size_t Engine::add_optimizer(torch::optim::Optimizer& optimizer, std::shared_ptr<void> owner) {
  Impl& s = *impl_;
  for (size_t i = 0; i < s.optimizers.size(); ++i)
    if (s.optimizers[i].optimizer == &optimizer) return i;
  s.strategy->prepare_optimizer(optimizer);
  s.optimizers.push_back({&optimizer, std::move(owner), false});
  return s.optimizers.size() - 1;
}

torch::optim::Optimizer& Engine::optimizer(size_t index) { return *impl_->optimizers.at(index).optimizer; }

void Engine::optimizer_step(size_t index) {
  Impl& s = *impl_;
  if (!s.sync) return;  // an accumulation micro-batch
  OptimizerEntry& e = s.optimizers.at(index);
  const bool skip = s.precision->before_step(*e.optimizer);
  if (!skip) {
    s.strategy->before_optimizer_step(*e.optimizer);
    e.optimizer->step();
    s.strategy->after_optimizer_step(*e.optimizer);
  }
  s.precision->after_step(*e.optimizer, skip);
  e.last_skipped = skip;
}

void Engine::optimizer_zero_grad(size_t index) {
  if (!impl_->sync) return;
  compat::zero_grad_in_place(*impl_->optimizers.at(index).optimizer);
}

bool Engine::optimizer_step_was_skipped(size_t index) const {
  return impl_->optimizers.at(index).last_skipped;
}

bool Engine::any_optimizer_step_skipped() const {
  for (auto& e : impl_->optimizers)
    if (e.last_skipped) return true;
  return false;
}

void Engine::add_scheduler() { ++impl_->schedulers; }

bool Engine::scheduler_should_step() const {
  const Impl& s = *impl_;
  if (!s.config.step_scheduler_with_optimizer) return true;
  if (!s.sync) return false;
  return !any_optimizer_step_skipped();
}

// ---- data loaders -------------------------------------------------------------------------

size_t Engine::add_loader(int64_t dataset_size, const DataLoaderOptions& options) {
  Impl& s = *impl_;
  LoaderEntry e;
  e.spec.dataset_size = dataset_size;
  e.spec.options = options;
  e.spec.world_size = s.process.world_size;
  e.spec.rank = s.process.rank;
  e.spec.even_batches = s.config.even_batches;
  e.spec.split_batches = s.config.split_batches;
  e.num_batches = count_batches(e.spec);  // validates the spec now, at prepare
  s.loaders.push_back(e);
  return s.loaders.size() - 1;
}

EpochPlan Engine::loader_begin_epoch(size_t loader) {
  Impl& s = *impl_;
  LoaderEntry& e = s.loaders.at(loader);
  EpochPlan plan = make_epoch_plan(e.spec, e.epoch++);
  s.active.push_back({loader, -1, plan.num_batches, 0});
  return plan;
}

void Engine::loader_at(size_t loader, int64_t batch, int64_t num_batches, int64_t num_padding) {
  for (auto it = impl_->active.rbegin(); it != impl_->active.rend(); ++it) {
    if (it->id != loader) continue;
    it->batch = batch;
    it->num_batches = num_batches;
    it->num_padding = num_padding;
    return;
  }
}

void Engine::loader_end(size_t loader) noexcept {
  auto& active = impl_->active;
  for (auto it = active.rbegin(); it != active.rend(); ++it) {
    if (it->id == loader) {
      active.erase(std::next(it).base());
      return;
    }
  }
}

int64_t Engine::loader_num_batches(size_t loader) const { return impl_->loaders.at(loader).num_batches; }

// ---- gradient accumulation ----------------------------------------------------------------

void Engine::begin_accumulate(const std::vector<size_t>& models) {
  Impl& s = *impl_;
  const int64_t n = s.config.gradient_accumulation_steps;
  const ActiveLoader* loader = s.innermost();
  if (s.end_of_dataloader()) {
    // The loader's last batch always synchronises and closes the window.
    if (s.accum_step % n == 0) s.window = 1;
    s.accum_step = 0;
    s.sync = true;
  } else {
    if (s.accum_step % n == 0) {
      // A new window: as long as the micro-batches left in the loader allow, so that a short
      // last window is a mean over the batches it really has.
      const int64_t left = loader != nullptr && loader->batch >= 0 ? loader->num_batches - loader->batch : n;
      s.window = std::max<int64_t>(1, std::min(n, left));
    }
    ++s.accum_step;
    s.sync = s.accum_step % n == 0;
  }
  ++s.accumulate_depth;
  for (size_t m : models) {
    ModelEntry& e = s.models.at(m);
    if (e.sync_enabled != s.sync) {
      s.strategy->set_gradient_sync(*e.module, s.sync);
      e.sync_enabled = s.sync;
    }
  }
}

void Engine::end_accumulate(const std::vector<size_t>& models) noexcept {
  Impl& s = *impl_;
  --s.accumulate_depth;
  for (size_t m : models) {
    try {
      ModelEntry& e = s.models.at(m);
      if (!e.sync_enabled) {
        s.strategy->set_gradient_sync(*e.module, true);
        e.sync_enabled = true;
      }
    } catch (const std::exception& ex) {
      get_logger("hasten", false)->error("{}", ex.what());
    }
  }
}

bool Engine::sync_gradients() const { return impl_->sync; }
int Engine::gradient_accumulation_steps() const { return impl_->config.gradient_accumulation_steps; }

void Engine::backward(const torch::Tensor& loss, bool retain_graph) {
  Impl& s = *impl_;
  torch::Tensor l = loss;
  if (s.accumulate_depth > 0 && s.window > 1) l = l / static_cast<double>(s.window);
  s.precision->scale_loss(l);
  s.strategy->before_backward();
  l.backward({}, retain_graph);
  s.strategy->after_backward();
}

double Engine::clip_grad_norm(size_t model, double max_norm, double norm_type) {
  Impl& s = *impl_;
  unscale_gradients();
  ModelEntry& e = s.models.at(model);
  if (s.strategy->has_clip_grad_norm()) return s.strategy->clip_grad_norm(*e.module, max_norm, norm_type);
  return torch::nn::utils::clip_grad_norm_(e.module->parameters(), max_norm, norm_type);
}

double Engine::clip_grad_norm(const std::vector<torch::Tensor>& parameters, double max_norm,
                              double norm_type) {
  unscale_gradients();
  return torch::nn::utils::clip_grad_norm_(parameters, max_norm, norm_type);
}

void Engine::clip_grad_value(size_t model, double clip_value) {
  unscale_gradients();
  torch::nn::utils::clip_grad_value_(impl_->models.at(model).module->parameters(), clip_value);
}

void Engine::unscale_gradients() {
  for (auto& e : impl_->optimizers) impl_->precision->unscale_gradients(*e.optimizer);
}

double Engine::loss_scale() const { return impl_->precision->loss_scale(); }

// ---- collectives on tensors ---------------------------------------------------------------

torch::Tensor Engine::gather(const torch::Tensor& tensor) {
  Impl& s = *impl_;
  torch::Tensor in = (tensor.dim() == 0 ? tensor.reshape({1}) : tensor).contiguous();
  if (s.process.world_size == 1) return in;
  s.check_collective("gather", in);
  auto sizes = in.sizes().vec();
  sizes[0] *= s.process.world_size;
  torch::Tensor out = torch::empty(sizes, in.options());
  DLTensor a = sdk::dl_view(in), b = sdk::dl_view(out);
  if (auto work = s.comm->allgather(a, b, nullptr)) work->wait(0);
  return out;
}

torch::Tensor Engine::gather_for_metrics(const torch::Tensor& tensor) {
  Impl& s = *impl_;
  torch::Tensor gathered = gather(tensor);
  const ActiveLoader* loader = s.innermost();
  if (s.process.world_size == 1 || loader == nullptr || loader->batch < 0) return gathered;
  // Drop the padding that completed this round: each rank says how many of its trailing
  // samples pad, and the per-rank chunks are contiguous in rank order.
  torch::Tensor pads = gather(torch::tensor({loader->num_padding}, torch::kLong));
  if (pads.sum().item<int64_t>() == 0) return gathered;
  const int64_t per_rank = tensor.dim() == 0 ? 1 : tensor.size(0);
  std::vector<torch::Tensor> keep;
  for (int64_t r = 0; r < s.process.world_size; ++r) {
    const int64_t real = std::max<int64_t>(0, per_rank - pads[r].item<int64_t>());
    keep.push_back(gathered.narrow(0, r * per_rank, real));
  }
  return torch::cat(keep, 0);
}

torch::Tensor Engine::reduce(const torch::Tensor& tensor, const std::string& op) {
  Impl& s = *impl_;
  const hasten_reduce_op rop = reduce_op(op);
  torch::Tensor t = tensor.clone().contiguous();
  if (s.process.world_size == 1) return t;
  s.check_collective("reduce(" + op + ")", t);
  s.allreduce_(t, rop);
  if (op == "mean") t = t / static_cast<double>(s.process.world_size);
  return t;
}

torch::Tensor Engine::broadcast(const torch::Tensor& tensor, int from) {
  Impl& s = *impl_;
  if (from < 0 || from >= s.process.world_size)
    throw UsageError("broadcast: from_process " + std::to_string(from) + " is out of range [0, " +
                     std::to_string(s.process.world_size) + ")");
  torch::Tensor t = tensor.clone().contiguous();
  if (s.process.world_size == 1) return t;
  s.check_collective("broadcast(from " + std::to_string(from) + ")", t);
  DLTensor v = sdk::dl_view(t);
  if (auto work = s.comm->broadcast(v, from, nullptr)) work->wait(0);
  return t;
}

std::shared_ptr<PendingWork> Engine::all_reduce_(torch::Tensor& tensor, ReduceOp op) {
  Impl& s = *impl_;
  if (!tensor.is_contiguous()) throw UsageError("all_reduce_: the tensor must be contiguous");
  auto pending = std::make_shared<PendingWork>();
  pending->keep_alive = tensor;
  if (s.process.world_size == 1) return pending;  // one rank: the reduction is the tensor
  s.check_collective("all_reduce_", tensor);
  DLTensor v = sdk::dl_view(tensor);
  pending->work = s.comm->allreduce(v, to_abi(op), nullptr);
  return pending;
}

torch::Tensor Engine::reduce_scatter(const torch::Tensor& tensor, ReduceOp op) {
  Impl& s = *impl_;
  const int64_t w = s.process.world_size;
  if (tensor.dim() == 0 || tensor.size(0) % w != 0)
    throw UsageError("reduce_scatter: dim 0 (" + (tensor.dim() ? std::to_string(tensor.size(0)) : std::string("scalar")) +
                     ") must be a multiple of the " + std::to_string(w) + " processes");
  torch::Tensor in = tensor.contiguous();
  auto sizes = in.sizes().vec();
  sizes[0] /= w;
  torch::Tensor out = torch::empty(sizes, in.options());
  if (w == 1) return out.copy_(in);
  s.check_collective("reduce_scatter", in);
  DLTensor a = sdk::dl_view(in), b = sdk::dl_view(out);
  if (auto work = s.comm->reduce_scatter(a, b, to_abi(op), nullptr)) work->wait(0);
  return out;
}

void Engine::broadcast_(torch::Tensor& tensor, int from) {
  Impl& s = *impl_;
  if (from < 0 || from >= s.process.world_size)
    throw UsageError("broadcast_: from_process " + std::to_string(from) + " is out of range [0, " +
                     std::to_string(s.process.world_size) + ")");
  if (!tensor.is_contiguous()) throw UsageError("broadcast_: the tensor must be contiguous");
  if (s.process.world_size == 1) return;
  s.check_collective("broadcast_(from " + std::to_string(from) + ")", tensor);
  DLTensor v = sdk::dl_view(tensor);
  if (auto work = s.comm->broadcast(v, from, nullptr)) work->wait(0);
}

std::string Engine::backend_for(const torch::Device& device) const {
  DLDevice d = sdk::dl_device(device);
  return impl_->comm->backend_for(d);
}

std::string Engine::broadcast(const std::string& text, int from) {
  if (impl_->process.world_size == 1) {
    broadcast(torch::zeros({1}), from);  // validates `from`
    return text;
  }
  torch::Tensor len = broadcast(torch::tensor({static_cast<int64_t>(text.size())}), from);
  const int64_t n = len.item<int64_t>();
  torch::Tensor bytes = torch::zeros({std::max<int64_t>(n, 1)}, torch::kUInt8);
  if (impl_->process.rank == from) std::memcpy(bytes.data_ptr(), text.data(), text.size());
  bytes = broadcast(bytes, from);
  return std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(n));
}

torch::Tensor Engine::pad_across_processes(const torch::Tensor& tensor, int64_t dim,
                                           double pad_value, bool pad_first) {
  if (tensor.dim() == 0) return tensor;
  if (dim < 0) dim += tensor.dim();
  if (dim < 0 || dim >= tensor.dim())
    throw UsageError("pad_across_processes: dim out of range for a tensor of " +
                     std::to_string(tensor.dim()) + " dimensions");
  torch::Tensor size = torch::tensor({tensor.size(dim)}, torch::kLong);
  const int64_t max_size = gather(size).max().item<int64_t>();
  if (max_size == tensor.size(dim)) return tensor;
  auto sizes = tensor.sizes().vec();
  sizes[dim] = max_size;
  torch::Tensor out = torch::full(sizes, pad_value, tensor.options());
  const int64_t offset = pad_first ? max_size - tensor.size(dim) : 0;
  out.narrow(dim, offset, tensor.size(dim)).copy_(tensor);
  return out;
}

void Engine::wait_for_everyone() {
  if (impl_->process.world_size == 1) return;
  impl_->check_collective("wait_for_everyone", torch::Tensor());
  impl_->comm->barrier(nullptr);
}

void Engine::set_trigger() { impl_->trigger = true; }

bool Engine::check_trigger() {
  torch::Tensor flag = torch::tensor({impl_->trigger ? int64_t{1} : int64_t{0}});
  const bool raised = reduce(flag, "sum").item<int64_t>() > 0;
  if (raised) impl_->trigger = false;
  return raised;
}

// ---- trackers -----------------------------------------------------------------------------

void Engine::init_trackers(const std::string& project, const std::string& hparams_json) {
  Impl& s = *impl_;
  if (!s.process.is_main_process()) return;  // trackers live on the main process
  if (!s.trackers.empty()) throw UsageError("init_trackers: trackers are already running");
  const fs::path dir = fs::path(s.config.effective_logging_dir()) / project;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw Error("init_trackers: cannot create logging directory '" + dir.string() + "': " + ec.message());
  const auto options = nlohmann::json::parse(s.config.tracker_options);
  for (const auto& name : s.config.trackers) {
    const std::string opts = options.contains(name) ? options[name].dump() : "{}";
    auto tracker = std::make_unique<TrackerInstance>(
        PluginRegistry::instance().select(PluginKind::Tracker, name), &s.host.api, opts);
    tracker->start(project, dir.string(), hparams_json, s.process.rank);
    s.trackers.push_back(std::move(tracker));
  }
}

void Engine::log(const std::vector<std::pair<std::string, double>>& values, int64_t step) {
  for (auto& t : impl_->trackers) t->log_scalars(values, step);
}

void Engine::log_text(const std::string& name, const std::string& text, int64_t step) {
  for (auto& t : impl_->trackers) t->log_text(name, text, step);
}

void Engine::end_training() {
  auto trackers = std::move(impl_->trackers);
  impl_->trackers.clear();
  for (auto& t : trackers) {
    t->flush();
    t->finish(HASTEN_OK);
  }
}

}  // namespace hasten::detail

namespace hasten {

UnitBase::~UnitBase() = default;

void UnitBase::hasten_enter() {
  if (engine_ != nullptr) engine_->unit_enter(model_, unit_);
}

void UnitBase::hasten_exit(std::vector<torch::Tensor>& outputs) {
  if (engine_ != nullptr) engine_->unit_exit(model_, unit_, outputs);
}

void Work::wait() {
  if (pending_ && pending_->work) pending_->work->wait(pending_->timeout_ms);
}

bool Work::is_completed() { return !pending_ || !pending_->work || pending_->work->test(); }

void Accelerator::init_trackers(const std::string& project, const Hparams& hparams) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (auto& [key, value] : hparams)
    std::visit([&, k = key](const auto& v) { j[k] = v; }, value);
  engine_->init_trackers(project, j.dump());
}

void set_seed(uint64_t seed, bool device_specific) {
  uint64_t s = seed;
  if (device_specific) s += static_cast<uint64_t>(detect_process_info(current_environment()).rank);
  torch::manual_seed(s);
  std::srand(static_cast<unsigned>(s));
}

void Accelerator::set_seed(uint64_t seed, bool device_specific) const {
  hasten::set_seed(seed + (device_specific ? static_cast<uint64_t>(process_index()) : 0), false);
}

}  // namespace hasten
