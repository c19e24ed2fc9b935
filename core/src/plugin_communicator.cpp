#include "plugin_communicator.hpp"

#include "current_stream.hpp"

#include <hasten/error.hpp>

#include <algorithm>
#include <cstring>
#include <vector>

namespace hasten::detail {

namespace {

class PluginWork final : public Work {
 public:
  PluginWork(CommInstance* comm, hasten_work* work) : comm_(comm), work_(work) {}
  ~PluginWork() override { comm_->free(work_); }
  void wait(int64_t timeout_ms) override {
    if (done_) return;
    try {
      comm_->wait(work_, timeout_ms);
    } catch (...) {
      // A failed wait (a timeout, a dead peer) ends the run: abort the backend so that no
      // other operation of this rank blocks on a collective that can never complete.
      comm_->abort();
      throw;
    }
    done_ = true;
  }
  bool test() override { return done_ || (done_ = comm_->test(work_)); }

 private:
  CommInstance* comm_;
  hasten_work* work_;
  bool done_ = false;
};

WorkPtr wrap(CommInstance* comm, hasten_work* w) {
  return w != nullptr ? std::make_unique<PluginWork>(comm, w) : nullptr;
}

// A collective on a CUDA buffer goes to the plugin with LibTorch's current stream unless the
// caller named one, so that it runs after the kernels producing the buffer (plugin.h: the
// plugin orders its work after `stream`). `storage` holds the amended copy.
const hasten_coll_options* on_current_stream(const DLDevice& device, const hasten_coll_options* o,
                                             hasten_coll_options& storage) {
  if (device.device_type != kDLCUDA || (o != nullptr && o->stream != nullptr)) return o;
  void* stream = current_stream(device);
  if (stream == nullptr) return o;
  storage = hasten_coll_options{HASTEN_STRUCT_INIT(hasten_coll_options), nullptr, 0};
  if (o != nullptr)  // a caller built against an older header may have a shorter struct
    std::memcpy(&storage, o, std::min<size_t>(o->struct_size, sizeof storage));
  storage.struct_size = sizeof storage;
  storage.stream = stream;
  return &storage;
}

class PluginCommunicator final : public Communicator {
 public:
  PluginCommunicator(int rank, int world, std::unique_ptr<CommInstance> cpu, std::unique_ptr<CommInstance> gpu)
      : rank_(rank), world_(world), cpu_(std::move(cpu)), gpu_(std::move(gpu)) {}
  ~PluginCommunicator() override {
    gpu_.reset();
    cpu_.reset();
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend_for(const DLDevice& device) const override {
    const CommInstance* c = device.device_type == kDLCUDA ? gpu_.get() : cpu_.get();
    return c ? c->name() : "none";
  }
  WorkPtr allreduce(DLTensor& b, hasten_reduce_op op, const hasten_coll_options* o) override {
    CommInstance& c = route(b.device);
    hasten_coll_options s;
    return wrap(&c, c.allreduce(b, op, on_current_stream(b.device, o, s)));
  }
  WorkPtr allgather(const DLTensor& in, DLTensor& out, const hasten_coll_options* o) override {
    CommInstance& c = route(in.device);
    hasten_coll_options s;
    return wrap(&c, c.allgather(in, out, on_current_stream(in.device, o, s)));
  }
  WorkPtr reduce_scatter(const DLTensor& in, DLTensor& out, hasten_reduce_op op,
                         const hasten_coll_options* o) override {
    CommInstance& c = route(in.device);
    hasten_coll_options s;
    if (c.has_reduce_scatter()) return wrap(&c, c.reduce_scatter(in, out, op, on_current_stream(in.device, o, s)));
    // The backend has none: allreduce a copy and keep this rank's slice (twice the traffic).
    if (in.device.device_type != kDLCPU)
      throw Error(c.label() + ": has no reduce_scatter for device buffers");
    const size_t bytes = dl_nbytes(in);
    std::vector<char> scratch(bytes);
    std::memcpy(scratch.data(), static_cast<const char*>(in.data) + in.byte_offset, bytes);
    DLTensor tmp = in;
    tmp.data = scratch.data();
    tmp.byte_offset = 0;
    if (auto w = wrap(&c, c.allreduce(tmp, op, o))) w->wait(0);
    const size_t slice = dl_nbytes(out);
    std::memcpy(static_cast<char*>(out.data) + out.byte_offset, scratch.data() + slice * static_cast<size_t>(rank_), slice);
    return nullptr;
  }
  WorkPtr broadcast(DLTensor& b, int root, const hasten_coll_options* o) override {
    CommInstance& c = route(b.device);
    hasten_coll_options s;
    return wrap(&c, c.broadcast(b, root, on_current_stream(b.device, o, s)));
  }
  void barrier(const hasten_coll_options* o) override {
    if (auto w = wrap(cpu_.get(), cpu_->barrier(o))) w->wait(0);
  }

 private:
  CommInstance& route(const DLDevice& device) {
    if (device.device_type == kDLCUDA) {
      if (!gpu_) throw Error("no comm backend for CUDA buffers in this run (the model is on the CPU)");
      return *gpu_;
    }
    if (device.device_type != kDLCPU)
      throw Error("no comm backend for buffers on device type " + std::to_string(device.device_type));
    return *cpu_;
  }

  int rank_, world_;
  std::unique_ptr<CommInstance> cpu_;
  std::unique_ptr<CommInstance> gpu_;
};

}  // namespace

std::unique_ptr<Communicator> make_plugin_communicator(int rank, int world, std::unique_ptr<CommInstance> cpu,
                                                       std::unique_ptr<CommInstance> gpu) {
  return std::make_unique<PluginCommunicator>(rank, world, std::move(cpu), std::move(gpu));
}

}  // namespace hasten::detail
