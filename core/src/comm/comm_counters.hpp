// The run's collective byte counts behind Accelerator::comm_stats(), shared by the world's
// communicator and every group's (each adds to the side its ranks are on). Atomic: strategies
// issue collectives from autograd's threads too.
#pragma once

#include <hasten/comm_stats.hpp>

#include <atomic>
#include <cstdint>

namespace hasten::detail {

class CommCounters {
 public:
  enum Op { Allreduce = 0, Allgather = 1, ReduceScatter = 2, Broadcast = 3 };
  void add(bool across_machines, Op op, uint64_t bytes) {
    bytes_[across_machines ? 1 : 0][op].fetch_add(bytes, std::memory_order_relaxed);
  }
  CommStats snapshot() const {
    CommStats s;
    CommBytes* sides[2] = {&s.within_machine, &s.across_machines};
    for (int side = 0; side < 2; ++side) {
      sides[side]->allreduce = bytes_[side][Allreduce].load(std::memory_order_relaxed);
      sides[side]->allgather = bytes_[side][Allgather].load(std::memory_order_relaxed);
      sides[side]->reduce_scatter = bytes_[side][ReduceScatter].load(std::memory_order_relaxed);
      sides[side]->broadcast = bytes_[side][Broadcast].load(std::memory_order_relaxed);
    }
    return s;
  }

 private:
  std::atomic<uint64_t> bytes_[2][4] = {};
};

}  // namespace hasten::detail
