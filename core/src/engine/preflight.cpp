// The launcher's check of a run's config before any worker starts: every plugin the config
// names exists and accepts its options. Without it a typo (an unknown strategy, a misspelt
// precision option) is the same error printed by every worker after they all started.
#include <hasten/config.hpp>
#include <hasten/plugin.h>
#include <hasten/registry.hpp>

#include "comm/comm_routing.hpp"
#include "plugins/plugin_instances.hpp"
#include "trackers/tracker_instance.hpp"

namespace hasten {

void check_config_plugins(const Config& config) {
  auto& registry = PluginRegistry::instance();
  if (!config.plugin_path.empty()) registry.add_search_directories(config.plugin_path);
  detail::plugin_options(registry.select(PluginKind::Strategy, config.strategy), config.strategy_options);
  detail::plugin_options(registry.select(PluginKind::Precision, config.precision), config.precision_options);
  // Several processes: the CPU backend and any GPU backend the config names, each with its
  // comm_options. The GPU's "auto" depends on the workers' devices, so it is left to them.
  if (config.num_processes > 1) {
    ProcessInfo run;
    run.world_size = config.num_processes;
    run.num_nodes = config.num_machines;
    run.local_world_size = config.num_processes / std::max(1, config.num_machines);
    for (const auto& [device, choice] : config.comm_backends) {
      if (device != "cpu" && choice == "auto") continue;
      const int32_t type = device == "cpu" ? kDLCPU : kDLCUDA;
      const std::string name = detail::choose_comm_backend(type, choice, run);
      const auto options = config.comm_options_by_device.find(device);
      detail::plugin_options(registry.select(PluginKind::Comm, name),
                             options == config.comm_options_by_device.end() ? "{}" : options->second);
    }
    if (config.comm_backends.count("cpu") == 0)
      detail::plugin_options(registry.select(PluginKind::Comm, detail::choose_comm_backend(kDLCPU, "auto", run)),
                             config.comm_options);
  }
  for (const auto& [selection, options] : detail::choose_trackers(config)) detail::plugin_options(selection, options);
}

}  // namespace hasten
