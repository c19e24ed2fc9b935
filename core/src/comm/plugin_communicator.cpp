#include "comm/plugin_communicator.hpp"
#include "util/trace_ranges.hpp"

#include "comm/current_stream.hpp"

#include <hasten/error.hpp>

#include <algorithm>
#include <cstring>
#include <vector>

namespace hasten::detail {

namespace {

// A plugin's work item behind the Work facade.
//
// Waits for CUDA work are stream-ordered when the backend can (ABI 1.6, work_wait_stream;
// plugin.h, "Stream-ordered waits"): wait(0) makes LibTorch's current stream of the calling
// thread on the buffer's device wait for the collective and returns without blocking the host,
// as c10d's NCCL work.wait() does. Work queued on that stream afterwards sees the results, and
// memory allocated on that stream may be freed at once (the caching allocator reuses it only in
// that stream's order); the core records its own buffers on the waited stream before freeing
// them (PendingWork, current_stream.hpp), so which stream allocated them does not matter.
// A wait with a timeout of its own, a backend without the slot, or no current stream to name
// blocks the host in work_wait, as before.
//
// Dropped without a wait (or waited on another stream than the current one), a CUDA work
// orders the current stream after it before it is freed, so that the buffer freed next is safe
// in that stream's order; work_free then returns at once (the backend watches the collective
// until it ends). Other work is freed as before: work_free waits for it first.
class PluginWork final : public Work {
 public:
  PluginWork(CommInstance* comm, hasten_work* work, const DLDevice& device)
      : comm_(comm), work_(work), device_(device) {}
  ~PluginWork() override {
    if (!done_ && stream_ordered()) {
      try {
        void* stream = nullptr;
        if (!comm_->test(work_) && find_current_stream(device_, &stream) && !(ordered_ && stream == ordered_on_))
          comm_->wait_stream(work_, stream);
      } catch (...) {  // an aborted backend: the failure was (or will be) reported elsewhere
      }
    }
    comm_->free(work_);
  }
  void wait(int64_t timeout_ms) override {
    if (done_) return;
    TraceRange range("hasten::wait");
    try {
      // The current stream; NULL is LibTorch's default stream, the legacy default stream.
      void* stream = nullptr;
      if (timeout_ms == 0 && stream_ordered() && find_current_stream(device_, &stream)) {
        comm_->wait_stream(work_, stream);
        ordered_ = true;
        ordered_on_ = stream;
        return;  // ordered, not done: test() still asks the backend
      }
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
  bool stream_ordered() const { return device_.device_type == kDLCUDA && comm_->has_wait_stream(); }

  CommInstance* comm_;
  hasten_work* work_;
  DLDevice device_;
  bool done_ = false;
  bool ordered_ = false;        // a stream-ordered wait ran
  void* ordered_on_ = nullptr;  // the stream it made wait (NULL: the legacy default stream)
};

WorkPtr wrap(CommInstance* comm, hasten_work* w, const DLDevice& device) {
  return w != nullptr ? std::make_unique<PluginWork>(comm, w, device) : nullptr;
}

// A collective on a CUDA buffer goes to the plugin with LibTorch's current stream unless the
// caller named one, so that it runs after the kernels producing the buffer (plugin.h: the
// plugin orders its work after `stream`). `storage` holds the amended copy.
const hasten_coll_options* on_current_stream(const DLDevice& device, const hasten_coll_options* o,
                                             hasten_coll_options& storage) {
  if (device.device_type != kDLCUDA || (o != nullptr && o->stream != nullptr)) return o;
  void* stream = current_stream(device);
  if (stream == nullptr) return o;
  storage = hasten_coll_options{HASTEN_STRUCT_INIT(hasten_coll_options), nullptr, 0, nullptr};
  if (o != nullptr)  // a caller built against an older header may have a shorter struct
    std::memcpy(&storage, o, std::min<size_t>(o->struct_size, sizeof storage));
  storage.struct_size = sizeof storage;
  storage.stream = stream;
  return &storage;
}

class PluginCommunicator final : public Communicator {
 public:
  PluginCommunicator(int rank, int world, std::unique_ptr<CommInstance> cpu, std::unique_ptr<CommInstance> gpu,
                     std::shared_ptr<CommCounters> counters, bool across_machines)
      : rank_(rank), world_(world), cpu_(std::move(cpu)), gpu_(std::move(gpu)), counters_(std::move(counters)),
        across_(across_machines) {}
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
    TraceRange range("hasten::allreduce");
    counters_->add(across_, CommCounters::Allreduce, dl_nbytes(b));
    CommInstance& c = route(b.device);
    hasten_coll_options s;
    return wrap(&c, c.allreduce(b, op, on_current_stream(b.device, o, s)), b.device);
  }
  WorkPtr allgather(const DLTensor& in, DLTensor& out, const hasten_coll_options* o) override {
    TraceRange range("hasten::allgather");
    counters_->add(across_, CommCounters::Allgather, dl_nbytes(out));
    CommInstance& c = route(in.device);
    hasten_coll_options s;
    return wrap(&c, c.allgather(in, out, on_current_stream(in.device, o, s)), in.device);
  }
  WorkPtr reduce_scatter(const DLTensor& in, DLTensor& out, hasten_reduce_op op,
                         const hasten_coll_options* o) override {
    TraceRange range("hasten::reduce_scatter");
    counters_->add(across_, CommCounters::ReduceScatter, dl_nbytes(in));
    CommInstance& c = route(in.device);
    hasten_coll_options s;
    if (c.has_reduce_scatter())
      return wrap(&c, c.reduce_scatter(in, out, op, on_current_stream(in.device, o, s)), in.device);
    // The backend has none: allreduce a copy and keep this rank's slice (twice the traffic).
    if (in.device.device_type != kDLCPU)
      throw Error(c.label() + ": has no reduce_scatter for device buffers");
    const size_t bytes = dl_nbytes(in);
    std::vector<char> scratch(bytes);
    std::memcpy(scratch.data(), static_cast<const char*>(in.data) + in.byte_offset, bytes);
    DLTensor tmp = in;
    tmp.data = scratch.data();
    tmp.byte_offset = 0;
    if (auto w = wrap(&c, c.allreduce(tmp, op, o), tmp.device)) w->wait(0);
    const size_t slice = dl_nbytes(out);
    std::memcpy(static_cast<char*>(out.data) + out.byte_offset, scratch.data() + slice * static_cast<size_t>(rank_), slice);
    return nullptr;
  }
  WorkPtr broadcast(DLTensor& b, int root, const hasten_coll_options* o) override {
    TraceRange range("hasten::broadcast");
    counters_->add(across_, CommCounters::Broadcast, dl_nbytes(b));
    CommInstance& c = route(b.device);
    hasten_coll_options s;
    return wrap(&c, c.broadcast(b, root, on_current_stream(b.device, o, s)), b.device);
  }
  void barrier(const hasten_coll_options* o) override {
    TraceRange range("hasten::barrier");
    if (auto w = wrap(cpu_.get(), cpu_->barrier(o), DLDevice{kDLCPU, 0})) w->wait(0);
  }
  // Each backend of the run splits its own communicator (the CPU one, then the GPU one: the
  // same order on every rank); the group's communicator routes as this one does.
  std::unique_ptr<Communicator> split(int color, int rank, int size, const std::string& store_prefix,
                                      bool across_machines) override {
    if (const std::string which = cannot_split(); !which.empty())
      throw PluginError(which + ": has no process groups (comm slot split, ABI 1.11)");
    std::unique_ptr<CommInstance> cpu;
    if (cpu_) cpu = cpu_->split(color, rank, size, store_prefix + "cpu/");
    std::unique_ptr<CommInstance> gpu;
    if (gpu_) gpu = gpu_->split(color, rank, size, store_prefix + "cuda/");
    return std::make_unique<PluginCommunicator>(rank, size, std::move(cpu), std::move(gpu), counters_, across_machines);
  }
  std::string cannot_split() const override {
    if (cpu_ && !cpu_->has_split()) return cpu_->label();
    if (gpu_ && !gpu_->has_split()) return gpu_->label();
    return "";
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
  std::shared_ptr<CommCounters> counters_;
  bool across_;
};

}  // namespace

std::unique_ptr<Communicator> make_plugin_communicator(int rank, int world, std::unique_ptr<CommInstance> cpu,
                                                       std::unique_ptr<CommInstance> gpu,
                                                       std::shared_ptr<CommCounters> counters, bool across_machines) {
  return std::make_unique<PluginCommunicator>(rank, world, std::move(cpu), std::move(gpu), std::move(counters),
                                              across_machines);
}

}  // namespace hasten::detail
