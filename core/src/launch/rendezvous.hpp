// Rendezvous of the ranks of a run through a key-value store hosted by rank 0 (hasten's own,
// store_server.cpp, which refuses clients without the run's token; under torchrun, the
// agent's c10d TCPStore). A rank that never arrives is named in the error instead of leaving
// the others waiting forever.
#pragma once

#include <hasten/process.hpp>

#include <cstdint>
#include <memory>

#include "comm/communicator.hpp"

namespace hasten::detail {

// Connects to (rank 0: hosts) the store at process.master_addr:master_port and waits until
// every rank has arrived, at most timeout_ms. Throws hasten::Error naming the missing ranks.
// The connection is the process's, shared by all its Accelerators (each under keys of its
// own, the n-th Accelerator of every rank meeting the n-th of the others) and kept until the
// process exits. Call the returned store's setup_finished() once the comm backends are open.
std::unique_ptr<Store> rendezvous(const ProcessInfo& process, int64_t timeout_ms);

// Called at exit (atexit, and by hasten::launch's workers, which end with _exit): rank 0,
// the store's host, waits until no rank is still setting up through its store.
void release_stores_before_exit();

}  // namespace hasten::detail
