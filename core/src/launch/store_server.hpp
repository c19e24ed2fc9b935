// Rank 0's key-value store for the run (hasten's store protocol, store_protocol.hpp): one
// thread that serves every rank's connection until the process exits. A client must present
// the run's token first; one that does not is refused, with one line in rank 0's log.
#pragma once

#include <string>

namespace hasten::detail {

struct StoreServerOptions {
  std::string bind_host;  // numeric address to listen on ("0.0.0.0" or "::": every interface)
  int port = 0;
  std::string token;      // the run's secret; empty: every client is served (PyTorch's trust model)
  int max_clients = 64;   // connections beyond this are closed at once
};

// Listens on options.bind_host:port and serves from a thread of its own; the server lives
// until the process exits. Throws hasten::Error with one line when the address cannot be
// bound (taken port, an address that is not this machine's).
void start_store_server(const StoreServerOptions& options);

}  // namespace hasten::detail
