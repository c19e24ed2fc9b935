// Comm plugin "nccl": collectives on CUDA buffers over NCCL, C tier (CUDA runtime and NCCL,
// no LibTorch). Rank 0 creates the NCCL unique id and shares it through the host's store.
//
// Operations are enqueued on the caller's stream (hasten_coll_options.stream) or, without
// one, on the communicator's own stream; the work item is a CUDA event recorded after the
// operation. A wait polls the event and NCCL's asynchronous error state until its deadline;
// a timeout or a remote failure aborts the communicator (so later operations fail at once)
// and is reported as a status with a message, never a hang.
#include <hasten/plugin.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

namespace {

using hasten::sdk::Error;
using Clock = std::chrono::steady_clock;

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(HASTEN_ERR_SYSTEM, std::string("nccl plugin: ") + what + ": " + cudaGetErrorString(e));
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

size_t count(const DLTensor& t) {
  size_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= static_cast<size_t>(t.shape[i]);
  return n;
}
void* ptr(const DLTensor& t) { return static_cast<char*>(t.data) + t.byte_offset; }

void require_cuda(const DLTensor& t, const char* op) {
  if (t.device.device_type != kDLCUDA)
    throw Error(HASTEN_ERR_UNSUPPORTED, std::string("nccl ") + op + ": only CUDA buffers (got device type " +
                                            std::to_string(t.device.device_type) + ")");
}

struct Work {
  cudaEvent_t event = nullptr;
};

class NcclComm final : public hasten::sdk::Comm {
 public:
  NcclComm(const hasten_host_api* host, std::string_view options) : Comm(host) {
    if (options != "{}" && options != "null")
      throw Error(HASTEN_ERR_INVALID_ARGUMENT, "nccl takes no options, got " + std::string(options));
  }

  ~NcclComm() override {
    if (comm_ != nullptr) {
      if (aborted_)
        ncclCommAbort(comm_);
      else
        ncclCommDestroy(comm_);
    }
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
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
    cuda_check(cudaSetDevice(device_), "cudaSetDevice");
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
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
    nccl_check(ncclCommInitRank(&comm_, world_, id, rank_), "ncclCommInitRank");
  }

  bool supports_device(int32_t device_type) override { return device_type == kDLCUDA; }

  hasten_work* allreduce(DLTensor& b, hasten_reduce_op op, const hasten_coll_options* o) override {
    require_cuda(b, "allreduce");
    cudaStream_t s = stream_of(o);
    nccl_check(ncclAllReduce(ptr(b), ptr(b), count(b), nccl_type(b.dtype), nccl_op(op), live(), s), "allreduce");
    return record(s);
  }

  hasten_work* allgather(const DLTensor& in, DLTensor& out, const hasten_coll_options* o) override {
    require_cuda(in, "allgather");
    require_cuda(out, "allgather");
    if (count(out) != count(in) * static_cast<size_t>(world_))
      throw Error(HASTEN_ERR_INVALID_ARGUMENT, "nccl allgather: output must hold world_size x input elements");
    cudaStream_t s = stream_of(o);
    nccl_check(ncclAllGather(ptr(in), ptr(out), count(in), nccl_type(in.dtype), live(), s), "allgather");
    return record(s);
  }

  hasten_work* reduce_scatter(const DLTensor& in, DLTensor& out, hasten_reduce_op op,
                              const hasten_coll_options* o) override {
    require_cuda(in, "reduce_scatter");
    require_cuda(out, "reduce_scatter");
    if (count(out) * static_cast<size_t>(world_) != count(in))
      throw Error(HASTEN_ERR_INVALID_ARGUMENT, "nccl reduce_scatter: input must hold world_size x output elements");
    cudaStream_t s = stream_of(o);
    nccl_check(ncclReduceScatter(ptr(in), ptr(out), count(out), nccl_type(in.dtype), nccl_op(op), live(), s),
               "reduce_scatter");
    return record(s);
  }

  hasten_work* broadcast(DLTensor& b, int32_t root, const hasten_coll_options* o) override {
    require_cuda(b, "broadcast");
    cudaStream_t s = stream_of(o);
    nccl_check(ncclBroadcast(ptr(b), ptr(b), count(b), nccl_type(b.dtype), root, live(), s), "broadcast");
    return record(s);
  }

  hasten_work* barrier(const hasten_coll_options* o) override {
    if (barrier_buffer_ == nullptr) cuda_check(cudaMalloc(&barrier_buffer_, sizeof(float)), "cudaMalloc");
    cudaStream_t s = stream_of(o);
    nccl_check(ncclAllReduce(barrier_buffer_, barrier_buffer_, 1, ncclFloat32, ncclSum, live(), s), "barrier");
    return record(s);
  }

  void wait(hasten_work* handle, int64_t timeout_ms) override {
    Work* w = reinterpret_cast<Work*>(handle);
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms > 0 ? timeout_ms : timeout_ms_);
    for (;;) {
      const cudaError_t q = cudaEventQuery(w->event);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) cuda_check(q, "waiting for a collective");
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        abort();
        nccl_check(async, "a peer failed during a collective");
      }
      if (Clock::now() > deadline) {
        abort();
        throw Error(HASTEN_ERR_TIMEOUT, "nccl: collective did not complete within " +
                                            std::to_string(timeout_ms_ / 1000.0) + " s (a peer is hung or gone); "
                                            "the communicator was aborted");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  bool test(hasten_work* handle) override {
    const cudaError_t q = cudaEventQuery(reinterpret_cast<Work*>(handle)->event);
    if (q == cudaErrorNotReady) return false;
    cuda_check(q, "testing a collective");
    return true;
  }

  void free_work(hasten_work* handle) noexcept override {
    Work* w = reinterpret_cast<Work*>(handle);
    if (w == nullptr) return;
    if (w->event) cudaEventDestroy(w->event);
    delete w;
  }

  void abort() noexcept override {
    if (comm_ != nullptr && !aborted_) {
      aborted_ = true;
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
  }

 private:
  ncclComm_t live() const {
    if (aborted_ || comm_ == nullptr)
      throw Error(HASTEN_ERR_REMOTE, "nccl: the communicator was aborted after an earlier failure");
    return comm_;
  }
  cudaStream_t stream_of(const hasten_coll_options* o) const {
    return o != nullptr && o->stream != nullptr ? static_cast<cudaStream_t>(o->stream) : stream_;
  }
  hasten_work* record(cudaStream_t s) {
    auto* w = new Work();
    cuda_check(cudaEventCreateWithFlags(&w->event, cudaEventDisableTiming), "cudaEventCreate");
    cuda_check(cudaEventRecord(w->event, s), "cudaEventRecord");
    return reinterpret_cast<hasten_work*>(w);
  }

  int rank_ = 0, world_ = 1, device_ = 0;
  int64_t timeout_ms_ = 1800000;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* barrier_buffer_ = nullptr;
  bool aborted_ = false;
};

constexpr hasten_plugin_descriptor kNccl = hasten::sdk::comm_descriptor<NcclComm>(
    "nccl", "1.0", "GPU collectives over NCCL on CUDA streams");

}  // namespace

HASTEN_PLUGIN_LIBRARY(&kNccl)
