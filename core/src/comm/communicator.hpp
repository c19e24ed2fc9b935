// The communicator facade: collectives on DLTensor buffers across the ranks of the run. The
// core and plugins (through the host API) use it; behind it sit the comm plugins, routed by
// the buffer's device. With one process every collective is the identity.
#pragma once

#include <hasten/plugin.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hasten::detail {

// An outstanding collective.
class Work {
 public:
  virtual ~Work() = default;
  // Throws hasten::Error with the backend's message on failure or timeout (0: default).
  virtual void wait(int64_t timeout_ms) = 0;
  virtual bool test() = 0;
};
using WorkPtr = std::unique_ptr<Work>;  // nullptr: already complete

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string backend_for(const DLDevice& device) const = 0;
  virtual WorkPtr allreduce(DLTensor& buffer, hasten_reduce_op op,
                            const hasten_coll_options* options) = 0;
  virtual WorkPtr allgather(const DLTensor& input, DLTensor& output,
                            const hasten_coll_options* options) = 0;
  virtual WorkPtr reduce_scatter(const DLTensor& input, DLTensor& output, hasten_reduce_op op,
                                 const hasten_coll_options* options) = 0;
  virtual WorkPtr broadcast(DLTensor& buffer, int root, const hasten_coll_options* options) = 0;
  virtual void barrier(const hasten_coll_options* options) = 0;
  // Process groups (ABI 1.11): a communicator over the ranks that pass the same color, in
  // which this rank is `rank` of `size`; its store keys under store_prefix; across_machines:
  // its members are on several machines (what comm_stats counts its bytes as). Collective:
  // every rank of this communicator calls it, in the same order. Outlived by this communicator.
  virtual std::unique_ptr<Communicator> split(int color, int rank, int size, const std::string& store_prefix,
                                              bool across_machines) = 0;
  // "" when split works; otherwise the backend that cannot split, named for a message.
  virtual std::string cannot_split() const = 0;
};

// The one-process communicator.
std::unique_ptr<Communicator> make_local_communicator();

// Bytes of a compact DLTensor.
size_t dl_nbytes(const DLTensor& t);

// A rendezvous key-value store shared by the ranks of a run.
class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  // Throws hasten::Error on timeout (0: default).
  virtual std::vector<uint8_t> get(const std::string& key, int64_t timeout_ms) = 0;
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // The engine's set-up (rendezvous and comm backends) no longer needs the store's host.
  virtual void setup_finished() {}
  // Empty while `rank` may still come; otherwise why it will not (it left, its process exited).
  virtual std::string departed(int /*rank*/) { return ""; }
  // The store's host only: at exit, its process waits (bounded by the store's timeout, and not
  // for peers whose processes are gone) until the counter `key` reaches `count`, so that peers
  // still reading what it published are not cut off by its exit.
  virtual void hold_at_exit_until(const std::string& /*key*/, int64_t /*count*/) {}
};

}  // namespace hasten::detail
