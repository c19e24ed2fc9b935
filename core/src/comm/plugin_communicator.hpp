// The communicator of a multi-process run: comm plugin instances behind the Communicator
// facade, routed by the buffer's device (CPU buffers to the CPU backend, CUDA buffers to the
// GPU backend).
#pragma once

#include <memory>

#include "comm/comm_counters.hpp"
#include "comm/comm_instance.hpp"
#include "comm/communicator.hpp"

namespace hasten::detail {

// counters: where every collective's bytes are added (never null), on the side across_machines
// says (the communicator's ranks are on several machines).
std::unique_ptr<Communicator> make_plugin_communicator(int rank, int world_size,
                                                       std::unique_ptr<CommInstance> cpu,
                                                       std::unique_ptr<CommInstance> gpu,
                                                       std::shared_ptr<CommCounters> counters,
                                                       bool across_machines);

}  // namespace hasten::detail
