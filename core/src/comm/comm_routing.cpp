#include "comm/comm_routing.hpp"

#include <hasten/error.hpp>
#include <hasten/registry.hpp>

#include <algorithm>
#include <vector>

#include "util/text_util.hpp"

namespace hasten::detail {

namespace {

std::string device_name(int32_t device_type) {
  switch (device_type) {
    case kDLCPU: return "cpu";
    case kDLCUDA: return "cuda";
    default: return "device type " + std::to_string(device_type);
  }
}

bool serves(const PluginInfo& p, int32_t device_type) {
  return std::find(p.serves_device_types.begin(), p.serves_device_types.end(), device_type) !=
         p.serves_device_types.end();
}

}  // namespace

std::string choose_comm_backend(int32_t device_type, const std::string& choice, const ProcessInfo& process) {
  if (choice != "auto") return choice;
  std::vector<PluginInfo> fit;
  std::vector<std::string> others;
  for (auto& p : PluginRegistry::instance().plugins()) {
    if (p.kind != PluginKind::Comm) continue;
    if (p.serves_declared && serves(p, device_type) && (p.serves_any_machines || process.num_nodes == 1))
      fit.push_back(p);
    else
      others.push_back(p.name);
  }
  if (fit.empty())
    throw PluginError("no comm plugin serves " + device_name(device_type) + " buffers" +
                      (process.num_nodes > 1 ? " across " + std::to_string(process.num_nodes) + " machines" : "") +
                      " (installed comm plugins that do not: " + (others.empty() ? "none" : join(others, ", ")) +
                      "); install one or name one with the config key comm");
  // Highest priority first; equal priorities in name order, so every rank picks the same.
  std::sort(fit.begin(), fit.end(), [](const PluginInfo& a, const PluginInfo& b) {
    return a.serves_priority != b.serves_priority ? a.serves_priority > b.serves_priority : a.name < b.name;
  });
  return fit.front().name;
}

std::unique_ptr<CommInstance> open_comm_backend(int32_t device_type, const std::string& choice,
                                                const std::string& options_json, const hasten_host_api* host,
                                                const ProcessInfo& process, int64_t timeout_ms,
                                                int64_t connect_timeout_ms, int32_t device_id) {
  const std::string name = choose_comm_backend(device_type, choice, process);
  auto comm = std::make_unique<CommInstance>(PluginRegistry::instance().select(PluginKind::Comm, name), host,
                                             options_json);
  if (!comm->supports_device(device_type))
    throw PluginError(comm->label() + ": does not handle " + device_name(device_type) +
                      " buffers (the config key comm selects a backend per device type: comm: {" +
                      device_name(device_type) + ": NAME})");
  comm->init(process.rank, process.world_size, timeout_ms, connect_timeout_ms, "hasten/comm/" + device_name(device_type) + "/",
             device_type == kDLCUDA ? device_id : -1);
  return comm;
}

}  // namespace hasten::detail
