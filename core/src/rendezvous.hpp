// Rendezvous of the ranks of a run through a key-value store hosted by rank 0 (c10d's
// TCPStore). A rank that never arrives is named in the error instead of leaving the others
// waiting forever.
#pragma once

#include <hasten/process.hpp>

#include <cstdint>
#include <memory>

#include "communicator.hpp"

namespace hasten::detail {

// Connects to (rank 0: hosts) the store at process.master_addr:master_port and waits until
// every rank has arrived, at most timeout_ms. Throws hasten::Error naming the missing ranks.
std::unique_ptr<Store> rendezvous(const ProcessInfo& process, int64_t timeout_ms);

}  // namespace hasten::detail
