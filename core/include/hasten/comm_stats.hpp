// Accelerator::comm_stats(): the bytes this process has handed to collectives since its
// Accelerator connected, by operation and by whether the collective's ranks span machines (the
// world of a run on several machines, or a device-mesh group whose members sit on different
// ones). Payload, not wire bytes: an allreduce's or a broadcast's buffer, an allgather's output,
// a reduce_scatter's input. What the backend's algorithm sends for them is its own (a ring
// allreduce of n ranks sends 2(n-1)/n of the buffer from each rank).
#pragma once

#include <cstdint>

namespace hasten {

struct CommBytes {
  uint64_t allreduce = 0;
  uint64_t allgather = 0;
  uint64_t reduce_scatter = 0;
  uint64_t broadcast = 0;
  uint64_t total() const { return allreduce + allgather + reduce_scatter + broadcast; }
};

struct CommStats {
  CommBytes within_machine;   // collectives whose ranks are all on this process's machine
  CommBytes across_machines;  // collectives whose ranks are on several machines
};

}  // namespace hasten
