// Engine setup and teardown: the resolved config, the device, the rendezvous and the
// communicator, the strategy and precision plugins, and the order they are torn down in.
#include <hasten/logging.hpp>
#include <hasten/registry.hpp>

#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/cuda.h>

#include <algorithm>

#include "comm/comm_instance.hpp"
#include "comm/comm_routing.hpp"
#include "engine/engine_state.hpp"
#include "comm/plugin_communicator.hpp"
#include "launch/rendezvous.hpp"

namespace hasten::detail {

Engine::Engine(const Options& options) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.config = resolve_config(options);
  set_log_level(s.config.log_level);
  s.process = detect_process_info(current_environment());
  if (!s.config.plugin_path.empty())
    PluginRegistry::instance().add_search_directories(s.config.plugin_path);

  if (!s.config.use_cpu && torch::cuda::is_available()) {
    // One GPU per process, from gpu_ids and LOCAL_RANK; two ranks on one GPU are refused here,
    // before any communicator exists (NCCL would refuse them only from inside its init).
    const int ordinal = select_cuda_device(s.config.gpu_ids, s.process.local_rank, s.process.local_world_size,
                                           static_cast<int>(torch::cuda::device_count()),
                                           gpu_bound_per_process(current_environment(), s.process.local_world_size));
    s.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(ordinal));
    s.dl_device = {kDLCUDA, ordinal};
    // Current before anything allocates: allocations that name no device, the legacy default
    // stream, the comm plugin's set-up and third-party code all use this rank's GPU.
    c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).setDevice(s.device);
  }

  s.host.process = s.process;
  s.host.timeout_ms = static_cast<int64_t>(s.config.timeout_s * 1000.0);
  auto& registry = PluginRegistry::instance();
  if (s.process.world_size > 1) {
    // A short timeout_s also shortens the rendezvous: it never waits longer than a collective.
    const auto rendezvous_ms =
        std::min(s.host.timeout_ms, static_cast<int64_t>(s.config.rendezvous_timeout_s * 1000.0));
    s.store = rendezvous(s.process, rendezvous_ms);
    s.host.store = s.store.get();
    // One backend per device type the run touches (comm_routing.cpp: the config, or the
    // plugins' own declarations under auto), each with its comm_options.
    auto backend = [&](int32_t type) {
      auto it = s.config.comm_backends.find(type == kDLCUDA ? "cuda" : "cpu");
      return it == s.config.comm_backends.end() ? std::string("auto") : it->second;
    };
    auto options = [&](int32_t type) {
      auto it = s.config.comm_options_by_device.find(type == kDLCUDA ? "cuda" : "cpu");
      return it == s.config.comm_options_by_device.end() ? std::string("{}") : it->second;
    };
    auto cpu = open_comm_backend(kDLCPU, backend(kDLCPU), options(kDLCPU), &s.host.api, s.process,
                                 s.host.timeout_ms, rendezvous_ms);
    std::unique_ptr<CommInstance> gpu;
    if (s.dl_device.device_type == kDLCUDA)
      gpu = open_comm_backend(kDLCUDA, backend(kDLCUDA), options(kDLCUDA), &s.host.api, s.process, s.host.timeout_ms,
                              rendezvous_ms, s.dl_device.device_id);
    s.comm_counters = std::make_shared<CommCounters>();
    s.comm = make_plugin_communicator(s.process.rank, s.process.world_size, std::move(cpu), std::move(gpu),
                                      s.comm_counters, s.process.num_nodes > 1);
    // The device mesh's groups connect through the store too (before setup_finished).
    s.groups = std::make_unique<ProcessGroups>(MeshLayout(s.config.parallelism, s.process.world_size),
                                               s.process.rank, *s.comm, s.process.local_world_size);
    // Every store call of the set-up is made: rank 0's process may exit from here on.
    s.store->setup_finished();
  } else {
    s.comm = make_local_communicator();
    s.groups = std::make_unique<ProcessGroups>(MeshLayout(s.config.parallelism, 1), 0, *s.comm, 1);
  }
  s.host.comm = s.comm.get();
  s.host.groups = s.groups.get();

  s.strategy = std::make_unique<StrategyInstance>(
      registry.select(PluginKind::Strategy, s.config.strategy), &s.host.api,
      s.config.strategy_options);
  s.precision = std::make_unique<PrecisionInstance>(
      registry.select(PluginKind::Precision, s.config.precision), &s.host.api,
      s.config.precision_options);
  s.precision->check_device(s.dl_device);
  s.precision_autocast = s.precision->has_autocast();
  s.unit_events = s.strategy->has_unit_events();
  s.start_sharded_build(*this);
  s.profile_tick();  // a window that starts at step 0 records from here
  // Every plugin this run names is selected: what the probe refused is now only a warning.
  registry.report_skipped_files();
  get_logger()->debug("accelerator: strategy {}, precision {}, device {}, rank {}/{}",
                      s.strategy->name(), s.precision->name(), s.device.str(), s.process.rank,
                      s.process.world_size);
}

Engine::~Engine() {
  impl_->profile_finish();  // a run that ended inside the window writes what it recorded
  Impl::stop_sharded_build(*this);
  // Units outlive the engine when the user keeps the model: detach them first.
  for (auto& m : impl_->models)
    for (UnitBase* u : m.units) u->engine_ = nullptr;
  // Trackers flush in destroy(); plugins go before the communicator they may use, and the
  // communicator before the store it rendezvoused through.
  impl_->trackers.clear();
  impl_->precision.reset();
  impl_->strategy.reset();
  // The groups' communicators go before the world's they were split from (plugin.h, split).
  impl_->host.groups = nullptr;
  impl_->groups.reset();
  impl_->host.comm = nullptr;
  impl_->comm.reset();
  impl_->host.store = nullptr;
  impl_->store.reset();
}

const Config& Engine::config() const { return impl_->config; }
void Engine::set_debug(bool enabled) { impl_->config.debug = enabled; }
const ProcessInfo& Engine::process() const { return impl_->process; }
torch::Device Engine::device() const { return impl_->device; }
std::string Engine::strategy_name() const { return impl_->strategy->name(); }
std::string Engine::precision_name() const { return impl_->precision->name(); }

}  // namespace hasten::detail
