// The host side of the plugin ABI: the hasten_host_api table hasten hands to plugins, the
// thread-local error message plugins set, and the context each table serves.
#pragma once

#include <hasten/plugin.h>
#include <hasten/process.hpp>

#include <string>

namespace hasten::detail {

class Communicator;
class ProcessGroups;
class Store;

// One table per context (one per Accelerator, plus one for the registry). The table is the
// first member so a plugin's host pointer leads back to its context.
struct HostContext {
  hasten_host_api api{};
  ProcessInfo process;
  int64_t timeout_ms = 1800 * 1000;
  Communicator* comm = nullptr;  // the run's collectives; nullptr: one process, no backend
  Store* store = nullptr;        // the rendezvous store; nullptr: none (one process)
  const ProcessGroups* groups = nullptr;  // the device mesh's groups (host->group); nullptr: none yet

  HostContext();
  HostContext(const HostContext&) = delete;
  HostContext& operator=(const HostContext&) = delete;
  static HostContext& from(const hasten_host_api* api) {
    return *reinterpret_cast<HostContext*>(const_cast<hasten_host_api*>(api));
  }
};

// The table handed to entry points: logging and errors only, one process.
const hasten_host_api* registry_host();

// The host's LibTorch fingerprint (same format as HASTEN_TORCH_FINGERPRINT).
const char* host_torch_fingerprint();

// Returns and clears the message a plugin set on this thread; `fallback` if none was set.
std::string take_plugin_error(const char* fallback = "no message");
void clear_plugin_error();
// Records message as this thread's host error (what last_error returns) and returns status.
hasten_status set_host_error(hasten_status status, const std::string& message);

const char* status_name(hasten_status status) noexcept;

}  // namespace hasten::detail
