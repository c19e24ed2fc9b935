// Collectives of a run with one process: every rank's contribution is this process's own.
#include <hasten/error.hpp>

#include <cstring>

#include "comm/communicator.hpp"

namespace hasten::detail {

size_t dl_nbytes(const DLTensor& t) {
  size_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= static_cast<size_t>(t.shape[i]);
  return n * ((t.dtype.bits * t.dtype.lanes + 7) / 8);
}

namespace {

void copy_buffer(const DLTensor& input, DLTensor& output) {
  if (input.device.device_type != kDLCPU || output.device.device_type != kDLCPU)
    throw Error("one-process collectives on non-CPU buffers go through the tensor API");
  const size_t n = dl_nbytes(input);
  if (dl_nbytes(output) != n)
    throw Error("collective output holds " + std::to_string(dl_nbytes(output)) +
                " bytes, expected " + std::to_string(n));
  auto* src = static_cast<const char*>(input.data) + input.byte_offset;
  auto* dst = static_cast<char*>(output.data) + output.byte_offset;
  if (src != dst) std::memmove(dst, src, n);
}

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string backend_for(const DLDevice&) const override { return "local"; }
  WorkPtr allreduce(DLTensor&, hasten_reduce_op, const hasten_coll_options*) override {
    return nullptr;  // sum, avg, min and max of one value are that value
  }
  WorkPtr allgather(const DLTensor& input, DLTensor& output,
                    const hasten_coll_options*) override {
    copy_buffer(input, output);
    return nullptr;
  }
  WorkPtr reduce_scatter(const DLTensor& input, DLTensor& output, hasten_reduce_op,
                         const hasten_coll_options*) override {
    copy_buffer(input, output);
    return nullptr;
  }
  WorkPtr broadcast(DLTensor&, int root, const hasten_coll_options*) override {
    if (root != 0) throw Error("broadcast root " + std::to_string(root) + " out of range [0, 1)");
    return nullptr;
  }
  void barrier(const hasten_coll_options*) override {}
  // One process: its only group is itself.
  std::unique_ptr<Communicator> split(int, int rank, int size, const std::string&, bool) override {
    if (rank != 0 || size != 1)
      throw Error("a one-process run has no group of " + std::to_string(size) + " ranks");
    return std::make_unique<LocalCommunicator>();
  }
  std::string cannot_split() const override { return ""; }
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator() {
  return std::make_unique<LocalCommunicator>();
}

}  // namespace hasten::detail
