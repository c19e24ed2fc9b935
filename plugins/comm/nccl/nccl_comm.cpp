// Comm plugin "nccl": collectives on CUDA buffers over NCCL, C tier (CUDA runtime and NCCL,
// no LibTorch). Rank 0 creates the NCCL unique id and shares it through the host's store.
//
// Streams and ordering
// --------------------
// Every collective runs on the communicator's own stream, created non-blocking: it has no
// implicit synchronisation with any other stream, so all ordering below is explicit. The
// "caller's stream" of an operation is hasten_coll_options.stream when the options give one,
// and otherwise the legacy default stream of the communicator's device (cudaStreamLegacy,
// LibTorch's default stream; not the per-thread default stream, and not LibTorch's current
// stream when that is a non-default stream the host did not pass).
//
// 1. Before the collective. During the call, an event is recorded on the caller's stream and
//    the comm stream is made to wait for it. The collective therefore touches its buffers only
//    after everything enqueued on the caller's stream before the call has finished (the
//    kernels that produced the gradients, say). Work on other streams is not waited for (but
//    for the legacy default stream's own implicit wait on blocking streams; LibTorch's pool
//    streams are non-blocking): a buffer produced on another stream must be ordered before
//    the caller's stream first, or that stream must be the one passed.
// 2. After the collective. An event ("done") is recorded on the comm stream right after it.
//    work_wait returns HASTEN_OK only once the host has seen "done" complete: the collective
//    has finished on the device, so any work enqueued on any stream after work_wait returns
//    sees its results, and the buffers are the caller's again. Where the caller's stream is
//    the legacy default stream (valid at any time), work_wait first makes that stream wait for
//    "done" (cudaStreamWaitEvent), so later work on it is ordered after the collective even
//    when the wait then fails (a timeout or a dead peer aborts the communicator; the stream
//    resumes once the aborted kernel has ended). An explicit options.stream is borrowed for
//    the call only (plugin-abi.md) and is never touched after the call returns: for it the
//    ordering rests on the host-side wait. The contract makes work_wait return a dead peer or
//    a timeout as a status, never hang, which is why it blocks the host (polling "done" and
//    NCCL's asynchronous error state until its deadline) instead of only enqueueing a stream
//    wait. Work enqueued between the call and the end of work_wait, on any stream, is not
//    ordered after the collective and must not touch its buffers.
// 3. work_test reports done only when "done" has completed: the same guarantee as 2.
// 4. work_free on a work not yet seen complete waits for it first (as work_wait, bounded by
//    the work's timeout, a failure logged), so its buffers are never handed back while the
//    collective may still use them; after an abort it returns at once.
//
// Events come from a pool (cudaEventDisableTiming) and go back to it: the one recorded on the
// caller's stream at the end of the call (a stream wait keeps the record it saw, so the event
// may be recorded again at once), "done" when the work is freed. In steady state no operation
// creates an event. Not for use under CUDA graph capture.
//
// A timeout or a remote failure aborts the communicator (later operations fail at once) and
// is reported as a status with a message.
#include <hasten/plugin.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "buffers.hpp"

namespace {

using hasten::comm::data_of;
using hasten::comm::elements;
using hasten::sdk::Error;
using Clock = std::chrono::steady_clock;

// op: the operation for the message ("allreduce"), or NULL.
void cuda_check(cudaError_t e, const char* what, const char* op = nullptr) {
  if (e != cudaSuccess)
    throw Error(HASTEN_ERR_SYSTEM, std::string("nccl") + (op ? std::string(" ") + op : std::string()) + ": " + what +
                                       ": " + cudaGetErrorString(e));
}

void nccl_check(ncclResult_t r, const char* what) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  const hasten_status st = r == ncclRemoteError || r == ncclSystemError ? HASTEN_ERR_REMOTE
                           : r == ncclInvalidArgument || r == ncclInvalidUsage ? HASTEN_ERR_INVALID_ARGUMENT
                                                                               : HASTEN_ERR_INTERNAL;
  throw Error(st, std::string("nccl: ") + what + ": " + ncclGetErrorString(r));
}

ncclDataType_t nccl_type(const DLDataType& d) {
  if (d.lanes == 1) {
    if (d.code == kDLFloat && d.bits == 32) return ncclFloat32;
    if (d.code == kDLFloat && d.bits == 64) return ncclFloat64;
    if (d.code == kDLFloat && d.bits == 16) return ncclFloat16;
    if (d.code == kDLBfloat && d.bits == 16) return ncclBfloat16;
    if (d.code == kDLInt && d.bits == 64) return ncclInt64;
    if (d.code == kDLInt && d.bits == 32) return ncclInt32;
    if (d.code == kDLUInt && d.bits == 8) return ncclUint8;
    if (d.code == kDLInt && d.bits == 8) return ncclInt8;
  }
  throw Error(HASTEN_ERR_UNSUPPORTED, "nccl: unsupported dtype (code " + std::to_string(d.code) + ", " +
                                          std::to_string(d.bits) + " bits)");
}

ncclRedOp_t nccl_op(hasten_reduce_op op) {
  switch (op) {
    case HASTEN_REDUCE_SUM: return ncclSum;
    case HASTEN_REDUCE_AVG: return ncclAvg;
    case HASTEN_REDUCE_MIN: return ncclMin;
    case HASTEN_REDUCE_MAX: return ncclMax;
  }
  throw Error(HASTEN_ERR_INVALID_ARGUMENT, "nccl: unknown reduce op " + std::to_string(static_cast<int>(op)));
}

void require_cuda(const DLTensor& t, const char* op) {
  if (t.device.device_type != kDLCUDA)
    throw Error(HASTEN_ERR_UNSUPPORTED, std::string("nccl ") + op + ": only CUDA buffers (got device type " +
                                            std::to_string(t.device.device_type) + ")");
}

// The per-call options, read as the ABI says: min(struct_size, our size) bytes into zeroed
// storage, so that fields the writer did not know read as 0/NULL.
hasten_coll_options read_options(const hasten_coll_options* o) {
  hasten_coll_options c{};
  if (o != nullptr) std::memcpy(&c, o, std::min<size_t>(o->struct_size, sizeof c));
  return c;
}

// Makes `device` current on this thread for the scope and restores the previous device after.
// Operations may come from any thread (autograd threads, a thread waiting on work), and the
// legacy default stream and new events belong to the current device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cuda_check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ == device)
      previous_ = -1;
    else
      cuda_check(cudaSetDevice(device), "cudaSetDevice");
  }
  // For paths that cannot report a failure: does what it can.
  DeviceGuard(int device, std::nothrow_t) noexcept {
    if (cudaGetDevice(&previous_) != cudaSuccess || previous_ == device || cudaSetDevice(device) != cudaSuccess)
      previous_ = -1;
  }
  ~DeviceGuard() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// Reusable events of the communicator's device, created with cudaEventDisableTiming (no
// timestamps: the cheapest kind to record and wait on). acquire() runs on that device.
class EventPool {
 public:
  EventPool() = default;
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  ~EventPool() {
    for (cudaEvent_t e : all_) (void)cudaEventDestroy(e);
  }
  cudaEvent_t acquire() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_.empty()) {
      cudaEvent_t e = free_.back();
      free_.pop_back();
      return e;
    }
    // Room first, so that neither the push below nor any release() can fail to allocate.
    all_.reserve(all_.size() + 1);
    free_.reserve(all_.size() + 1);
    cudaEvent_t e = nullptr;
    cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    all_.push_back(e);
    return e;
  }
  void release(cudaEvent_t e) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(e);  // capacity for every event created was reserved in acquire()
  }

 private:
  std::mutex mutex_;
  std::vector<cudaEvent_t> free_, all_;
};

// An event of the pool for a scope: back to the pool at its end unless release()d.
class PooledEvent {
 public:
  explicit PooledEvent(EventPool& pool) : pool_(pool), event_(pool.acquire()) {}
  ~PooledEvent() {
    if (event_ != nullptr) pool_.release(event_);
  }
  PooledEvent(const PooledEvent&) = delete;
  PooledEvent& operator=(const PooledEvent&) = delete;
  cudaEvent_t get() const { return event_; }
  cudaEvent_t release() {
    cudaEvent_t e = event_;
    event_ = nullptr;
    return e;
  }

 private:
  EventPool& pool_;
  cudaEvent_t event_;
};

struct Work {
  cudaEvent_t done = nullptr;      // recorded on the comm stream after the collective; pooled
  bool on_default_stream = false;  // the caller's stream was the legacy default stream
  int64_t timeout_ms = 0;          // the call's timeout (0: the init timeout)
  std::atomic<bool> completed{false};  // the host saw `done` complete
  std::atomic<bool> ordered{false};    // the legacy default stream was made to wait for `done`
};

class NcclComm final : public hasten::sdk::Comm {
 public:
  // CUDA buffers, ranks on any machines.
  static constexpr int32_t kDevices[] = {kDLCUDA};
  static constexpr hasten_comm_serves serves = hasten::sdk::comm_serves(kDevices, HASTEN_COMM_SCOPE_ANY, 30);
  NcclComm(const hasten_host_api* host, std::string_view options) : Comm(host) {
    hasten::sdk::Options(host, options, "nccl", {});  // takes none: any key is an error naming it
  }

  ~NcclComm() override {
    DeviceGuard device(device_, std::nothrow);
    if (comm_ != nullptr) {  // NULL after an abort, which released it
      // With nothing left on the comm stream, a clean destroy; otherwise the outstanding work
      // is aborted (ncclCommDestroy would wait for it, forever if a peer is gone).
      if (stream_ != nullptr && cudaStreamQuery(stream_) == cudaSuccess)
        (void)ncclCommDestroy(comm_);
      else
        (void)ncclCommAbort(comm_);
    }
    if (barrier_buffer_ != nullptr) (void)cudaFree(barrier_buffer_);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    // events_ is destroyed after this body.
  }

  void init(const hasten_comm_init& init) override {
    rank_ = init.rank;
    world_ = init.world_size;
    timeout_ms_ = init.timeout_ms > 0 ? init.timeout_ms : 1800000;
    int devices = 0;
    cuda_check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
    if (devices == 0) throw Error(HASTEN_ERR_UNSUPPORTED, "nccl: no CUDA device");
    const auto info = hasten::sdk::process_info(host());
    device_ = info.local_rank % devices;
    // The calling thread (the training loop's) keeps this rank's device current.
    cuda_check(cudaSetDevice(device_), "cudaSetDevice");
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    cuda_check(cudaMalloc(&barrier_buffer_, sizeof(float)), "cudaMalloc");
    cuda_check(cudaMemset(barrier_buffer_, 0, sizeof(float)), "cudaMemset");
    const std::string key = std::string(init.store_prefix ? init.store_prefix : "nccl/") + "unique_id";
    ncclUniqueId id;
    if (rank_ == 0) {
      nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
      hasten::sdk::check(host(), host()->store_set(host(), key.c_str(), &id, sizeof id), "publishing the NCCL id");
    } else {
      size_t size = 0;
      hasten::sdk::check(host(), host()->store_get(host(), key.c_str(), &id, sizeof id, &size, timeout_ms_),
                         "reading the NCCL id from rank 0");
    }
    ncclComm_t comm = nullptr;
    nccl_check(ncclCommInitRank(&comm, world_, id, rank_), "ncclCommInitRank");
    std::lock_guard<std::mutex> lock(mutex_);
    comm_ = comm;
  }

  bool supports_device(int32_t device_type) override { return device_type == kDLCUDA; }

  hasten_work* allreduce(DLTensor& b, hasten_reduce_op op, const hasten_coll_options* o) override {
    require_cuda(b, "allreduce");
    void* data = data_of(b);
    const size_t n = elements(b);
    const ncclDataType_t type = nccl_type(b.dtype);
    const ncclRedOp_t red = nccl_op(op);
    return issue("allreduce", o,
                 [&](ncclComm_t c, cudaStream_t s) { return ncclAllReduce(data, data, n, type, red, c, s); });
  }

  hasten_work* allgather(const DLTensor& in, DLTensor& out, const hasten_coll_options* o) override {
    require_cuda(in, "allgather");
    require_cuda(out, "allgather");
    const size_t n = elements(in);
    if (elements(out) != n * static_cast<size_t>(world_))
      throw Error(HASTEN_ERR_INVALID_ARGUMENT, "nccl allgather: output must hold world_size x input elements");
    const void* src = data_of(in);
    void* dst = data_of(out);
    const ncclDataType_t type = nccl_type(in.dtype);
    return issue("allgather", o, [&](ncclComm_t c, cudaStream_t s) { return ncclAllGather(src, dst, n, type, c, s); });
  }

  hasten_work* reduce_scatter(const DLTensor& in, DLTensor& out, hasten_reduce_op op,
                              const hasten_coll_options* o) override {
    require_cuda(in, "reduce_scatter");
    require_cuda(out, "reduce_scatter");
    const size_t n = elements(out);
    if (n * static_cast<size_t>(world_) != elements(in))
      throw Error(HASTEN_ERR_INVALID_ARGUMENT, "nccl reduce_scatter: input must hold world_size x output elements");
    const void* src = data_of(in);
    void* dst = data_of(out);
    const ncclDataType_t type = nccl_type(in.dtype);
    const ncclRedOp_t red = nccl_op(op);
    return issue("reduce_scatter", o,
                 [&](ncclComm_t c, cudaStream_t s) { return ncclReduceScatter(src, dst, n, type, red, c, s); });
  }

  hasten_work* broadcast(DLTensor& b, int32_t root, const hasten_coll_options* o) override {
    require_cuda(b, "broadcast");
    void* data = data_of(b);
    const size_t n = elements(b);
    const ncclDataType_t type = nccl_type(b.dtype);
    return issue("broadcast", o,
                 [&](ncclComm_t c, cudaStream_t s) { return ncclBroadcast(data, data, n, type, root, c, s); });
  }

  // Ordered like the others: it completes once every rank's caller's stream has reached it.
  hasten_work* barrier(const hasten_coll_options* o) override {
    void* data = barrier_buffer_;
    return issue("barrier", o, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(data, data, 1, ncclFloat32, ncclSum, c, s);
    });
  }

  void wait(hasten_work* handle, int64_t timeout_ms) override {
    Work& w = work_of(handle);
    if (w.completed) return;
    DeviceGuard device(device_);
    // Stream order for the legacy default stream, before anything can fail below (see 2.).
    if (w.on_default_stream && !w.ordered) {
      cuda_check(cudaStreamWaitEvent(cudaStreamLegacy, w.done, 0), "ordering the default stream after the collective",
                 "wait");
      w.ordered = true;
    }
    const int64_t limit = timeout_ms > 0 ? timeout_ms : w.timeout_ms > 0 ? w.timeout_ms : timeout_ms_;
    const auto deadline = Clock::now() + std::chrono::milliseconds(limit);
    while (!poll(w)) {
      if (Clock::now() >= deadline) {
        abort();
        throw Error(HASTEN_ERR_TIMEOUT, "nccl: collective did not complete within " +
                                            std::to_string(static_cast<double>(limit) / 1000.0) +
                                            " s (a peer is hung or gone); the communicator was aborted");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  bool test(hasten_work* handle) override {
    Work& w = work_of(handle);
    if (w.completed) return true;
    DeviceGuard device(device_);
    return poll(w);
  }

  void free_work(hasten_work* handle) noexcept override {
    Work* w = reinterpret_cast<Work*>(handle);
    if (w == nullptr) return;
    // Not seen complete: wait first (see 4.). After an abort there is nothing to wait for,
    // and the failure was reported by whichever wait or operation met it.
    if (!w->completed && !aborted_) {
      try {
        wait(handle, 0);
      } catch (const std::exception& e) {
        hasten::sdk::log(host(), HASTEN_LOG_WARN, "nccl",
                         std::string("a collective freed before it was waited on failed: ") + e.what());
      } catch (...) {
      }
    }
    events_.release(w->done);
    delete w;
  }

  void abort() noexcept override {
    std::lock_guard<std::mutex> lock(mutex_);
    abort_locked();
  }

 private:
  // Enqueues one collective (enqueue(comm, stream) makes the NCCL call) ordered after the
  // caller's stream, and returns its work. On a failure nothing is left in flight except what
  // the message says, and every event is back in the pool.
  template <class Enqueue>
  hasten_work* issue(const char* op, const hasten_coll_options* options, Enqueue&& enqueue) {
    const hasten_coll_options o = read_options(options);
    // One caller at a time on the communicator (NCCL calls on one communicator must not run
    // concurrently), and no abort while its handle is in use. An abort from another thread
    // waits for an enqueue in progress.
    std::lock_guard<std::mutex> lock(mutex_);
    const ncclComm_t comm = live();
    DeviceGuard device(device_);
    const cudaStream_t caller = o.stream != nullptr ? static_cast<cudaStream_t>(o.stream) : cudaStreamLegacy;
    auto work = std::make_unique<Work>();
    work->on_default_stream = o.stream == nullptr;
    work->timeout_ms = o.timeout_ms;
    PooledEvent ready(events_), done(events_);
    cuda_check(cudaEventRecord(ready.get(), caller), "recording an event on the caller's stream", op);
    cuda_check(cudaStreamWaitEvent(stream_, ready.get(), 0), "ordering the comm stream after the caller's stream", op);
    nccl_check(enqueue(comm, stream_), op);
    const cudaError_t recorded = cudaEventRecord(done.get(), stream_);
    if (recorded != cudaSuccess) {
      // The collective is enqueued but cannot be waited on (the CUDA context is broken):
      // abort, so that it cannot keep using the buffers or hang, and report.
      abort_locked();
      cuda_check(recorded, "recording the collective's completion (the communicator was aborted)", op);
    }
    work->done = done.release();
    return reinterpret_cast<hasten_work*>(work.release());
  }

  // One look at w: true when it completed; throws when the communicator failed or was
  // aborted (then the collective may have been cut short: its results are not reported).
  bool poll(Work& w) {
    const cudaError_t q = cudaEventQuery(w.done);
    if (aborted_)
      throw Error(HASTEN_ERR_REMOTE, "nccl: the communicator was aborted (after a failure) before this collective "
                                     "was seen to complete");
    if (q == cudaSuccess) {
      w.completed = true;
      return true;
    }
    if (q != cudaErrorNotReady) cuda_check(q, "querying the collective's completion", "wait");
    ncclResult_t async = ncclSuccess;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (aborted_ || comm_ == nullptr) return false;  // aborted meanwhile: reported at the next look
      nccl_check(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
    }
    if (async != ncclSuccess && async != ncclInProgress) {
      abort();
      nccl_check(async, "a peer failed during a collective (the communicator was aborted)");
    }
    return false;
  }

  void abort_locked() noexcept {
    if (comm_ != nullptr && !aborted_) {
      aborted_ = true;
      (void)ncclCommAbort(comm_);
      comm_ = nullptr;
    }
  }

  ncclComm_t live() const {
    if (aborted_)
      throw Error(HASTEN_ERR_REMOTE, "nccl: the communicator was aborted after an earlier failure");
    if (comm_ == nullptr) throw Error(HASTEN_ERR_INVALID_USAGE, "nccl: init has not completed");
    return comm_;
  }

  static Work& work_of(hasten_work* handle) {
    if (handle == nullptr) throw Error(HASTEN_ERR_INVALID_ARGUMENT, "nccl: work is NULL");
    return *reinterpret_cast<Work*>(handle);
  }

  int rank_ = 0, world_ = 1, device_ = 0;
  int64_t timeout_ms_ = 1800000;
  std::mutex mutex_;                // guards comm_ and the NCCL calls on it
  ncclComm_t comm_ = nullptr;       // NULL before init and after an abort
  std::atomic<bool> aborted_{false};
  cudaStream_t stream_ = nullptr;   // the comm stream (non-blocking)
  void* barrier_buffer_ = nullptr;  // one float on device_, for barrier()
  EventPool events_;                // every event of this communicator; destroyed last
};

constexpr hasten_plugin_descriptor kNccl = hasten::sdk::comm_descriptor<NcclComm>(
    "nccl", "1.0", "GPU collectives over NCCL on CUDA streams");

}  // namespace

HASTEN_PLUGIN_LIBRARY(&kNccl)
