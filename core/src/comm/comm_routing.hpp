// Which comm plugin serves which device type: the config key `comm` names one per device
// type, or "auto" picks among the plugins that declare they serve it (hasten_comm_serves).
// The core holds no backend's name.
#pragma once

#include <hasten/process.hpp>

#include <memory>
#include <string>

#include <dlpack/dlpack.h>

#include "comm/comm_instance.hpp"

namespace hasten::detail {

// The plugin name or path that serves `device_type` in this run. choice: the config's value
// for that device type ("auto", a name or a path). Throws PluginError naming what is
// installed when nothing fits.
std::string choose_comm_backend(int32_t device_type, const std::string& choice, const ProcessInfo& process);

// Creates the chosen backend with its options and connects it to the other ranks: its
// collectives wait at most timeout_ms by default, its set-up at most connect_timeout_ms.
// device_id: for kDLCUDA, the CUDA ordinal the host picked for this rank (already current on
// this thread), handed to the backend as hasten_comm_init.device_id; -1: none.
std::unique_ptr<CommInstance> open_comm_backend(int32_t device_type, const std::string& choice,
                                                const std::string& options_json, const hasten_host_api* host,
                                                const ProcessInfo& process, int64_t timeout_ms,
                                                int64_t connect_timeout_ms, int32_t device_id = -1);

}  // namespace hasten::detail
