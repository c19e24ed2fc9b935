// The state behind a hasten::Work (Accelerator::all_reduce_, collectives.cpp).
#pragma once

#include <torch/types.h>

#include <cstdint>

#include "comm/communicator.hpp"
#include "comm/current_stream.hpp"

namespace hasten::detail {

// keep_alive is declared before
// work so that it is destroyed after it (members go in reverse order): the work's destructor
// first waits for the collective, or for CUDA work orders LibTorch's current stream after it
// (plugin_communicator.cpp), and only then is the buffer released. A CUDA buffer is also
// recorded on that current stream, so that the caching allocator reuses its memory only after
// the collective whichever stream allocated it (a stream-ordered wait orders just the one).
struct PendingWork {
  torch::Tensor keep_alive;  // the buffer must outlive the operation
  WorkPtr work;
  int64_t timeout_ms = 0;
  PendingWork() = default;
  PendingWork(const PendingWork&) = delete;
  PendingWork& operator=(const PendingWork&) = delete;
  ~PendingWork() {
    if (!work) return;
    work.reset();
    record_on_current_stream(keep_alive);
  }
};

}  // namespace hasten::detail
