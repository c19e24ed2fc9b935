// A rank's connection to the run's store (hasten's store protocol, store_protocol.hpp): one
// socket, one request at a time, every call bounded by its deadline with poll().
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "launch/store_wire.hpp"

namespace hasten::detail {

// Nothing accepted the connection (nothing listens yet, or the address is unreachable):
// the caller may try again.
class StoreUnreachable : public Error {
 public:
  using Error::Error;
};

// Connects to host:port within connect_ms and presents the token; the hello's answer must
// come within hello_ms. Throws StoreUnreachable (try again), StoreNoAnswer (something accepted
// and never answered: not a hasten store), StoreRefused (another run's store, or a token it
// does not accept; the message is the store's).
std::unique_ptr<StoreWire> connect_store(const std::string& host, int port, const std::string& token,
                                         int64_t connect_ms, int64_t hello_ms);

}  // namespace hasten::detail
