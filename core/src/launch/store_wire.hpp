// The wire under the run's key-value store, and how a call on it fails. Two wires exist:
// hasten's own store (store_server.cpp, store_client.cpp), authenticated by the run's token,
// for every run hasten's launchers or ranks start, and c10d's TCPStore client
// (c10d_store_wire.cpp) for torchrun's agent store, which hasten joins but does not host.
#pragma once

#include <hasten/error.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace hasten::detail {

// A call that got no answer by its deadline. The connection is broken from then on: a late
// answer would be read as the answer to the next call.
class StoreNoAnswer : public Error {
 public:
  using Error::Error;
};

// The store's host closed the connection (it failed or exited).
class StoreClosed : public Error {
 public:
  using Error::Error;
};

// A wait for a key ended before the key appeared; the connection is fine.
class StoreKeyTimeout : public Error {
 public:
  using Error::Error;
};

// The store refused this client (another run's token, or none where one is needed).
class StoreRefused : public Error {
 public:
  using Error::Error;
};

// Every call has a deadline (timeout_ms); each is one request and its answer.
class StoreWire {
 public:
  virtual ~StoreWire() = default;
  virtual void set(const std::string& key, const std::vector<uint8_t>& value, int64_t timeout_ms) = 0;
  // The value of a key that exists (check first).
  virtual std::vector<uint8_t> get(const std::string& key, int64_t timeout_ms) = 0;
  // Waits at most wait_ms for key to appear and returns its value; StoreKeyTimeout otherwise.
  virtual std::vector<uint8_t> wait_get(const std::string& key, int64_t wait_ms) = 0;
  // Adds delta to the key's integer value (0 when absent) and returns the sum.
  virtual int64_t add(const std::string& key, int64_t delta, int64_t timeout_ms) = 0;
  virtual bool check(const std::string& key, int64_t timeout_ms) = 0;
};

}  // namespace hasten::detail
