// torchrun's agent store is c10d's TCPStore, hosted by the elastic agent: hasten's ranks join
// it as c10d clients, under the agent's per-attempt key prefix, as torch's env:// does.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "launch/store_wire.hpp"

namespace hasten::detail {

// One attempt to connect to torchrun's store at host:port (c10d's tries take up to ~3x
// attempt_ms). Throws StoreUnreachable with c10d's first line (try again), StoreNoAnswer when
// something accepted and never answered. c10d's own waits default to call_timeout_ms.
std::unique_ptr<StoreWire> connect_c10d_store(const std::string& host, int port, const std::string& key_prefix,
                                              int64_t attempt_ms, int64_t call_timeout_ms);

// The rendezvous (LibTorch-free, launch/) reaches connect_c10d_store through this pointer,
// which c10d_store_wire.cpp (LibTorch's half of the core) sets when libhasten loads: launch/
// links without LibTorch, and a program without that half is told so instead of failing to link.
using C10dStoreConnector = std::unique_ptr<StoreWire> (*)(const std::string& host, int port,
                                                          const std::string& key_prefix, int64_t attempt_ms,
                                                          int64_t call_timeout_ms);
C10dStoreConnector& c10d_store_connector();

}  // namespace hasten::detail
