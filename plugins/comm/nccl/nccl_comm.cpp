// Comm plugin "nccl": collectives on CUDA buffers over NCCL, C tier (CUDA runtime and NCCL,
// no LibTorch). Rank 0 creates the NCCL unique id and shares it through the host's store.
//
// Set-up
// ------
// - NCCL version. One libnccl.so.2 per process: LibTorch loads it first (the wheel's
//   nvidia/nccl/lib), so this plugin runs against that library whatever it was compiled
//   against. init compares the nccl.h it was compiled with (NCCL_VERSION_CODE) with the
//   library (ncclGetVersion) and refuses a different major.minor, naming both (the layout of
//   ncclConfig_t and the symbols differ between them); rank 0 logs both.
// - Device. hasten_comm_init.device_id (ABI 1.6): the ordinal the host picked for this rank
//   (gpu_ids, LOCAL_RANK) and made current. A host older than 1.6, or -1, leaves the choice
//   here: local_rank modulo the visible devices, refused when the machine runs more ranks than
//   it has devices (NCCL would refuse two ranks on one GPU, but only from inside its init). An
//   ordinal out of range is refused before any other CUDA call but the device count.
// - Deadline. All of init is bounded by connect_timeout_ms (ABI 1.4; else timeout_ms), counted
//   from its start: the wait for rank 0's id, then ncclCommInitRankConfig with
//   config.blocking = 0, polled (ncclCommGetAsyncError) until it settles. Past the deadline the
//   communicator is aborted (ncclCommAbort) and init fails with one line saying it timed out
//   after N ms and which ranks never entered NCCL's initialisation: each rank sets the store key
//   <store_prefix>init_entered/<rank> just before it does. With one rank no store is used.
// - Non-blocking communicator. Any NCCL call on it may return ncclInProgress (a collective
//   while NCCL connects to its peers, say); such a call is followed, under the communicator's
//   lock, by polling ncclCommGetAsyncError until it settles (bounded by the work's deadline),
//   so that no NCCL call on the communicator overlaps another and an operation is enqueued on
//   its stream when the call returns.
//
// Buffers
// -------
// require_cuda_compact (common/buffers.hpp) refuses, before any CUDA call, a buffer that is
// not CUDA, not on this rank's device (DLTensor device_id), or not dense row-major (strides
// NULL or the compact ones); byte_offset is honoured.
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
//    ordering rests on the host-side wait. work_wait returns a dead peer or a timeout as a
//    status, never hangs: it blocks the host, polling "done" and NCCL's asynchronous error
//    state until its deadline. Work enqueued between the call and the end of work_wait, on
//    any stream, is not ordered after the collective and must not touch its buffers.
// 3. work_wait_stream (ABI 1.6) enqueues cudaStreamWaitEvent(stream, "done") on the stream
//    it is given (NULL: the legacy default stream) and returns without blocking the host:
//    work enqueued on that stream afterwards sees the results, and the buffers are the
//    caller's again in that stream's order (plugin.h, "Stream-ordered waits"). The work is
//    then handed to the watchdog (below), which enforces its deadline. A failure already
//    known (an aborted communicator, NCCL's asynchronous error) is returned; a later one is
//    found by the watchdog. A work already complete returns at once and touches no stream.
// 4. work_test reports done only when "done" has completed: the same guarantee as 2.
// 5. work_free on a work that went through work_wait_stream returns at once: if the
//    collective has not ended, the work stays with the watchdog, which releases it (its event
//    back to the pool) once "done" completes or the communicator is aborted. work_free on any
//    other work not yet seen complete waits for it first (as work_wait, bounded by the work's
//    timeout, a failure logged), so its buffers are never handed back while the collective may
//    still use them; after an abort it returns at once.
//
// Events come from a pool (cudaEventDisableTiming) and go back to it: the one recorded on the
// caller's stream at the end of the call (a stream wait keeps the record it saw, so the event
// may be recorded again at once), "done" when the work is freed (or, after work_wait_stream,
// when the watchdog lets go of it: it must stay unrecorded while the watchdog queries it). In
// steady state no operation creates an event. Not for use under CUDA graph capture.
//
// Watchdog
// --------
// A thread, started by the first work_wait_stream, that every 10 ms looks at the works made
// stream-ordered and not yet seen complete, as ProcessGroupNCCL's watchdog does: completion
// ("done"), the work's deadline (its options' timeout_ms, else init's timeout_ms, from the
// call that issued it), CUDA errors, and NCCL's asynchronous error state. A timeout or an
// error aborts the communicator (the waiting streams resume once the aborted kernels end;
// the results of a collective cut short are undefined), is logged as one line, and every
// later operation, wait and test on this communicator fails with that line.
//
// A timeout or a remote failure aborts the communicator (later operations fail at once) and
// is reported as a status with a message.
#include <hasten/plugin.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "buffers.hpp"
#include "group_connect.hpp"
#include "nccl_device.hpp"
#include "nccl_support.hpp"

namespace {

using namespace hasten::nccl;
using hasten::comm::data_of;
using hasten::comm::elements;
using hasten::comm::require_cuda_compact;
using hasten::sdk::Error;
using Ms = std::chrono::milliseconds;

constexpr Ms kWatchdogPeriod{10};

class NcclComm final : public hasten::sdk::Comm {
 public:
  // CUDA buffers, ranks on any machines.
  static constexpr int32_t kDevices[] = {kDLCUDA};
  static constexpr hasten_comm_serves serves = hasten::sdk::comm_serves(kDevices, HASTEN_COMM_SCOPE_ANY, 30);
  NcclComm(const hasten_host_api* host, std::string_view options) : Comm(host), options_(options) {
    hasten::sdk::Options(host, options, "nccl", {});  // takes none: any key is an error naming it
  }

  ~NcclComm() override {
    {
      std::lock_guard<std::mutex> lock(watch_mutex_);
      stop_ = true;
    }
    watch_cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    std::optional<DeviceGuard> device;
    if (device_ >= 0) device.emplace(device_, std::nothrow);
    if (comm_ != nullptr) {  // NULL after an abort, which released it
      // With nothing left on the comm stream, a clean destroy; otherwise the outstanding work
      // is aborted (ncclCommDestroy would wait for it, forever if a peer is gone).
      if (stream_ != nullptr && cudaStreamQuery(stream_) == cudaSuccess)
        (void)ncclCommDestroy(comm_);
      else
        (void)ncclCommAbort(comm_);
    }
    // Works freed while the watchdog still had them: nothing runs any more.
    for (Work* w : watch_)
      if (w->orphaned) delete w;  // its event is destroyed with the pool
    if (barrier_buffer_ != nullptr) (void)cudaFree(barrier_buffer_);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    // events_ is destroyed after this body.
  }

  // ABI 1.11: a group's communicator, on this rank's device. Compiled against NCCL 2.18 or
  // later (and so running it: init refuses another major.minor), ncclCommSplit of this
  // communicator, which every rank of it calls (as the host calls split); splitShare stays 0,
  // so the group has resources of its own and aborting it (a failed wait) leaves the world's
  // communicator alone. Before 2.18 a communicator of its own among the members
  // (group_connect.hpp: a unique id published under the group's store prefix).
  Comm* split(const hasten_comm_split& split) override {
    hasten_comm_init init = init_;
    init.device_id = device_;  // the device this rank runs on, whoever picked it
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
    auto group = std::make_unique<NcclComm>(host(), options_);
    group->init_split(*this, init, split);
    return group.release();
#else
    return hasten::comm::connect_group<NcclComm>(host(), options_, init, split);
#endif
  }

  void init(const hasten_comm_init& init) override {
    init_ = init;
    init_.store_prefix = nullptr;  // borrowed for the call only
    // Everything that needs no GPU first: the NCCL versions and the arguments.
    const NcclVersion version = checked_nccl_version();
    if (init.world_size < 1 || init.rank < 0 || init.rank >= init.world_size)
      throw Error(HASTEN_ERR_INVALID_ARGUMENT, "nccl: rank " + std::to_string(init.rank) + " of world size " +
                                                   std::to_string(init.world_size) + " is not a rank of the run");
    // device_id reads as -1 from a host older than 1.6 (plugin.hpp's trampoline).
    if (init.device_id < -1)
      throw Error(HASTEN_ERR_INVALID_ARGUMENT, "nccl: device_id " + std::to_string(init.device_id) +
                                                   " is not a CUDA ordinal (allowed: 0 and up, or -1 to let the plugin pick)");
    rank_ = init.rank;
    world_ = init.world_size;
    timeout_ms_ = init.timeout_ms > 0 ? init.timeout_ms : 1800000;
    const int64_t connect_ms = init.connect_timeout_ms > 0 ? init.connect_timeout_ms : timeout_ms_;
    const char* which = init.connect_timeout_ms > 0 ? "connect_timeout_ms" : "timeout_ms";
    const auto start = Clock::now();
    const auto deadline = start + Ms(connect_ms);
    const std::string prefix = init.store_prefix ? init.store_prefix : "nccl/";

    open_device(init.device_id);

    ncclUniqueId id;
    if (rank_ == 0) {
      nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
      if (world_ > 1)
        hasten::sdk::check(host(), host()->store_set(host(), (prefix + "unique_id").c_str(), &id, sizeof id),
                           "publishing the NCCL id");
    } else {
      size_t size = 0;
      const hasten_status st = host()->store_get(host(), (prefix + "unique_id").c_str(), &id, sizeof id, &size,
                                                 std::max<int64_t>(1, left_ms(deadline)));
      if (st != HASTEN_OK) {
        const std::string why = host()->last_error != nullptr ? host()->last_error(host()) : "";
        throw Error(st, st == HASTEN_ERR_TIMEOUT
                            ? "nccl: NCCL initialisation timed out after " + std::to_string(connect_ms) + " ms (" +
                                  which + ") on rank " + std::to_string(rank_) + ": rank 0 never published the NCCL id (" +
                                  why + ")"
                            : "nccl: reading the NCCL id from rank 0 failed: " + why);
      }
      // Exactly an id: anything else under the key was not published by rank 0's plugin.
      if (size != sizeof id)
        throw Error(HASTEN_ERR_INVALID_USAGE, "nccl: the NCCL id rank 0 published has " + std::to_string(size) +
                                                  " bytes, not " + std::to_string(sizeof id));
    }
    if (world_ > 1) {  // best effort: only the message of a timeout below reads it
      const char one = 1;
      (void)host()->store_set(host(), (prefix + "init_entered/" + std::to_string(rank_)).c_str(), &one, 1);
    }

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // bounded below instead of blocking without a deadline
    ncclComm_t comm = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&comm, world_, id, rank_, &config);
    adopt(comm, r, "ncclCommInitRankConfig", deadline,
          " after " + std::to_string(connect_ms) + " ms (" + which + ")" + missing_ranks(prefix));
    if (rank_ == 0)
      hasten::sdk::log(host(), HASTEN_LOG_INFO, "nccl",
                       "NCCL " + version.text() + " (compiled against " + NcclVersion(NCCL_VERSION_CODE).text() +
                           "), " + std::to_string(world_) + " rank(s)");
    hasten::sdk::log(host(), HASTEN_LOG_DEBUG, "nccl",
                     "rank " + std::to_string(rank_) + " on cuda:" + std::to_string(device_) + ", initialised in " +
                         std::to_string(std::chrono::duration_cast<Ms>(Clock::now() - start).count()) + " ms");
  }

  bool supports_device(int32_t device_type) override { return device_type == kDLCUDA; }

 private:
  // This rank's device (picked when device_id is -1), made current for the calling thread (the
  // training loop's, which keeps it), the communicator's stream and the barrier's buffer.
  void open_device(int device_id) {
    const int device = pick_device(device_id);
    cuda_check(cudaSetDevice(device), "cudaSetDevice");
    device_ = device;
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    cuda_check(cudaMalloc(&barrier_buffer_, sizeof(float)), "cudaMalloc");
    cuda_check(cudaMemset(barrier_buffer_, 0, sizeof(float)), "cudaMemset");
  }

  // A communicator `call` returned r for (non-blocking): settled by the deadline, it becomes
  // this instance's; otherwise it is aborted and the error names the call (`late`: what a
  // timeout's message adds).
  void adopt(ncclComm_t comm, ncclResult_t r, const char* call, Clock::time_point deadline, const std::string& late) {
    if (r != ncclSuccess && r != ncclInProgress) {
      if (comm != nullptr) (void)ncclCommAbort(comm);
      throw Error(status_of(r), std::string("nccl: ") + call + " on cuda:" + std::to_string(device_) + ": " + nccl_text(r));
    }
    const ncclResult_t state = settle(comm, deadline);
    if (state == ncclInProgress) {
      (void)ncclCommAbort(comm);
      throw Error(HASTEN_ERR_TIMEOUT, std::string("nccl: NCCL initialisation (") + call + ") timed out" + late + " on rank " +
                                          std::to_string(rank_) + " of " + std::to_string(world_) +
                                          "; the communicator was aborted");
    }
    if (state != ncclSuccess) {
      (void)ncclCommAbort(comm);
      throw Error(status_of(state), std::string("nccl: NCCL initialisation (") + call + ") failed on rank " +
                                        std::to_string(rank_) + " (cuda:" + std::to_string(device_) + "): " +
                                        nccl_text(state));
    }
    std::lock_guard<std::mutex> lock(mutex_);
    comm_ = comm;
  }

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
  // split's communicator: ncclCommSplit of `parent` (colour: the group; key: the rank in it).
  void init_split(NcclComm& parent, const hasten_comm_init& init, const hasten_comm_split& split) {
    init_ = init;
    init_.store_prefix = nullptr;
    init_.rank = split.rank;
    init_.world_size = split.size;
    rank_ = split.rank;
    world_ = split.size;
    timeout_ms_ = init.timeout_ms > 0 ? init.timeout_ms : 1800000;
    const int64_t connect_ms = init.connect_timeout_ms > 0 ? init.connect_timeout_ms : timeout_ms_;
    const auto deadline = Clock::now() + Ms(connect_ms);
    open_device(init.device_id);
    ncclComm_t parent_comm = nullptr;
    {
      std::lock_guard<std::mutex> lock(parent.mutex_);
      parent_comm = parent.comm_;
    }
    if (parent_comm == nullptr)
      throw Error(HASTEN_ERR_INVALID_USAGE, "nccl: split of a communicator that was aborted");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    const ncclResult_t r = ncclCommSplit(parent_comm, split.color, split.rank, &comm, &config);
    adopt(comm, r, "ncclCommSplit", deadline, " after " + std::to_string(connect_ms) + " ms");
    hasten::sdk::log(host(), HASTEN_LOG_DEBUG, "nccl",
                     "group " + std::to_string(split.color) + ": rank " + std::to_string(rank_) + " of " +
                         std::to_string(world_) + " (ncclCommSplit)");
  }
#endif

 public:

  hasten_work* allreduce(DLTensor& b, hasten_reduce_op op, const hasten_coll_options* o) override {
    require_cuda_compact(b, device_, "nccl", "allreduce");
    void* data = data_of(b);
    const size_t n = elements(b);
    const ncclDataType_t type = nccl_type(b.dtype);
    const ncclRedOp_t red = nccl_op(op);
    return issue("allreduce", o,
                 [&](ncclComm_t c, cudaStream_t s) { return ncclAllReduce(data, data, n, type, red, c, s); });
  }

  hasten_work* allgather(const DLTensor& in, DLTensor& out, const hasten_coll_options* o) override {
    require_cuda_compact(in, device_, "nccl", "allgather");
    require_cuda_compact(out, device_, "nccl", "allgather");
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
    require_cuda_compact(in, device_, "nccl", "reduce_scatter");
    require_cuda_compact(out, device_, "nccl", "reduce_scatter");
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
    require_cuda_compact(b, device_, "nccl", "broadcast");
    if (root < 0 || root >= world_)
      throw Error(HASTEN_ERR_INVALID_ARGUMENT, "nccl broadcast: root " + std::to_string(root) + " is not a rank of the " +
                                                   std::to_string(world_));
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
    const int64_t limit = timeout_ms > 0 ? timeout_ms : w.timeout_ms;
    const auto deadline = Clock::now() + Ms(limit);
    while (!poll(w)) {
      if (Clock::now() >= deadline) {
        const std::string why = std::string(w.op) + " did not complete within " + seconds(limit) +
                                " s (a peer is hung or gone)";
        fail(why);
        throw Error(HASTEN_ERR_TIMEOUT, "nccl: " + why + "; the communicator was aborted");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // ABI 1.6: see 3. in the design comment.
  void wait_stream(hasten_work* handle, void* stream) override {
    Work& w = work_of(handle);
    if (w.completed) return;
    if (aborted_) throw aborted_error();
    DeviceGuard device(device_);
    const cudaError_t q = cudaEventQuery(w.done);
    if (q == cudaSuccess) {
      w.completed = true;
      return;
    }
    if (q != cudaErrorNotReady) cuda_check(q, "querying the collective's completion", "wait_stream");
    const cudaStream_t s = stream != nullptr ? static_cast<cudaStream_t>(stream) : cudaStreamLegacy;
    cuda_check(cudaStreamWaitEvent(s, w.done, 0), "ordering the stream after the collective", "wait_stream");
    if (s == cudaStreamLegacy) w.ordered = true;
    watch(w);
    check_async_error();  // a failure already known is reported now; a later one by the watchdog
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
    {
      std::lock_guard<std::mutex> lock(watch_mutex_);
      if (w->watched) {
        // Stream-ordered (see 5.): the watchdog keeps it until the collective ends, unless it
        // already has (one query, so that the events of finished work go straight back).
        if (!w->completed && !aborted_ && cudaEventQuery(w->done) == cudaSuccess) w->completed = true;
        if (!w->completed && !aborted_) {
          w->orphaned = true;
          return;
        }
        w->watched = false;
        watch_.erase(std::remove(watch_.begin(), watch_.end(), w), watch_.end());
      }
    }
    // Not seen complete and never stream-ordered: wait first (see 5.). After an abort there
    // is nothing to wait for, and the failure was reported by whichever wait or operation met
    // it. A work the watchdog let go of completed, or the communicator was aborted.
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

  void abort() noexcept override { fail(""); }

 private:
  // The device of this rank (see Set-up).
  int pick_device(int32_t wanted) {
    int devices = 0;
    const cudaError_t counted = cudaGetDeviceCount(&devices);
    if (counted != cudaSuccess) devices = 0;
    const std::string sees = "this process sees " + std::to_string(devices) + " CUDA device(s)" +
                             visible_devices_note() +
                             (counted != cudaSuccess ? std::string(" (cudaGetDeviceCount: ") + cudaGetErrorString(counted) + ")"
                                                     : std::string());
    if (wanted >= 0) {
      if (wanted >= devices)
        throw Error(HASTEN_ERR_INVALID_ARGUMENT,
                    "nccl: device_id " + std::to_string(wanted) + " is out of range: " + sees +
                        (devices > 0 ? "; allowed: 0 to " + std::to_string(devices - 1) : std::string()));
      return wanted;
    }
    if (devices == 0) throw Error(HASTEN_ERR_UNSUPPORTED, "nccl: no CUDA device: " + sees);
    const auto info = hasten::sdk::process_info(host());
    if (info.local_world_size > devices)
      throw Error(HASTEN_ERR_INVALID_ARGUMENT,
                  "nccl: " + std::to_string(info.local_world_size) + " ranks on this machine but " + sees +
                      ": two ranks would share a GPU, which NCCL refuses; run at most " + std::to_string(devices) +
                      " processes per machine");
    return info.local_rank % devices;
  }

  // Polls a non-blocking communicator after a call that returned ncclInProgress until it has
  // settled: ncclSuccess or the error it ended in; ncclInProgress when the deadline came first.
  static ncclResult_t settle(ncclComm_t comm, Clock::time_point deadline) {
    for (;;) {
      ncclResult_t state = ncclInProgress;
      const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
      if (r != ncclSuccess) return r;
      if (state != ncclInProgress) return state;
      if (Clock::now() >= deadline) return ncclInProgress;
      std::this_thread::sleep_for(Ms(1));
    }
  }

  static int64_t left_ms(Clock::time_point deadline) {
    return std::chrono::duration_cast<Ms>(deadline - Clock::now()).count();
  }

  // After an init timeout: " ; ranks that never entered NCCL's initialisation: 1, 3", from
  // the store keys each rank sets as it enters (checked for at most ~2 s), or why it is not
  // known.
  std::string missing_ranks(const std::string& prefix) {
    if (world_ <= 1) return "";
    std::vector<int> missing;
    bool complete = true;
    const auto stop = Clock::now() + Ms(2000);
    for (int r = 0; r < world_; ++r) {
      if (r == rank_) continue;
      if (missing.size() >= 16 || Clock::now() >= stop) {
        complete = false;
        break;
      }
      char value[8];
      size_t size = 0;
      const std::string key = prefix + "init_entered/" + std::to_string(r);
      if (host()->store_get(host(), key.c_str(), value, sizeof value, &size, 1) != HASTEN_OK) missing.push_back(r);
    }
    if (missing.empty())
      return complete ? "; every rank entered it (one may have died inside it, or the network between the ranks is "
                        "blocked)"
                      : "";
    std::string list;
    for (int r : missing) list += (list.empty() ? "" : ", ") + std::to_string(r);
    return "; ranks that never entered it: " + list + (complete ? "" : " (and maybe others, not checked)");
  }

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
    work->op = op;
    work->on_default_stream = o.stream == nullptr;
    work->timeout_ms = o.timeout_ms > 0 ? o.timeout_ms : timeout_ms_;
    work->issued = Clock::now();
    PooledEvent ready(events_), done(events_);
    cuda_check(cudaEventRecord(ready.get(), caller), "recording an event on the caller's stream", op);
    cuda_check(cudaStreamWaitEvent(stream_, ready.get(), 0), "ordering the comm stream after the caller's stream", op);
    const ncclResult_t r = enqueue(comm, stream_);
    if (r == ncclInProgress) {
      // Non-blocking: the call is not enqueued until the communicator settles (see Set-up).
      const ncclResult_t state = settle(comm, work->issued + Ms(work->timeout_ms));
      if (state != ncclSuccess) {
        const std::string why =
            state == ncclInProgress
                ? std::string(op) + " was not enqueued within " + seconds(work->timeout_ms) +
                      " s (NCCL was still connecting to its peers: a peer is hung or gone)"
                : std::string(op) + " failed while NCCL enqueued it: " + nccl_text(state);
        fail_locked(why);
        throw Error(state == ncclInProgress ? HASTEN_ERR_TIMEOUT : status_of(state),
                    "nccl: " + why + "; the communicator was aborted");
      }
    } else {
      nccl_check(r, op);
    }
    const cudaError_t recorded = cudaEventRecord(done.get(), stream_);
    if (recorded != cudaSuccess) {
      // The collective is enqueued but cannot be waited on (the CUDA context is broken):
      // abort, so that it cannot keep using the buffers or hang, and report.
      fail_locked(std::string(op) + ": recording its completion failed: " + cudaGetErrorString(recorded));
      cuda_check(recorded, "recording the collective's completion (the communicator was aborted)", op);
    }
    work->done = done.release();
    return reinterpret_cast<hasten_work*>(work.release());
  }

  // One look at w: true when it completed; throws when the communicator failed or was
  // aborted (then the collective may have been cut short: its results are not reported).
  bool poll(Work& w) {
    const cudaError_t q = cudaEventQuery(w.done);
    if (aborted_) throw aborted_error();
    if (q == cudaSuccess) {
      w.completed = true;
      return true;
    }
    if (q != cudaErrorNotReady) cuda_check(q, "querying the collective's completion", "wait");
    check_async_error();
    return false;
  }

  // NCCL's asynchronous error state: a failure aborts the communicator and throws.
  void check_async_error() {
    ncclResult_t async = ncclSuccess;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (aborted_ || comm_ == nullptr) return;  // aborted meanwhile: reported at the next look
      nccl_check(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
    }
    if (async != ncclSuccess && async != ncclInProgress) {
      const std::string why = "a peer failed during a collective: " + nccl_text(async);
      fail(why);
      throw Error(status_of(async), "nccl: " + why + " (the communicator was aborted)");
    }
  }

  // Hands a stream-ordered work to the watchdog, starting it the first time.
  void watch(Work& w) {
    std::lock_guard<std::mutex> lock(watch_mutex_);
    if (w.watched) return;
    if (!watchdog_.joinable()) watchdog_ = std::thread([this] { watchdog(); });
    watch_.push_back(&w);
    w.watched = true;
    watch_cv_.notify_one();
  }

  // The watchdog thread (see Watchdog in the design comment).
  void watchdog() noexcept {
    (void)cudaSetDevice(device_);
    std::unique_lock<std::mutex> lock(watch_mutex_);
    while (!stop_) {
      if (watch_.empty()) {
        watch_cv_.wait(lock, [&] { return stop_ || !watch_.empty(); });
        continue;
      }
      std::string failure;
      const bool aborted = aborted_;
      const auto now = Clock::now();
      for (size_t i = 0; i < watch_.size();) {
        Work* w = watch_[i];
        bool finished = aborted || w->completed;
        if (!finished) {
          const cudaError_t q = cudaEventQuery(w->done);
          if (q == cudaSuccess) {
            w->completed = true;
            finished = true;
          } else if (q != cudaErrorNotReady) {
            if (failure.empty())
              failure = std::string(w->op) + ": querying its completion failed: " + cudaGetErrorString(q);
          } else if (now - w->issued >= Ms(w->timeout_ms)) {
            if (failure.empty())
              failure = std::string(w->op) + " did not complete within " + seconds(w->timeout_ms) +
                        " s of being issued (a peer is hung or gone)";
          }
        }
        if (!finished) {
          ++i;
          continue;
        }
        w->watched = false;
        if (w->orphaned) {
          events_.release(w->done);
          delete w;
        }
        watch_[i] = watch_.back();
        watch_.pop_back();
      }
      if (aborted || watch_.empty()) continue;
      lock.unlock();
      if (failure.empty()) failure = async_failure();
      if (!failure.empty()) {
        fail(failure);
        hasten::sdk::log(host(), HASTEN_LOG_ERROR, "nccl",
                         "rank " + std::to_string(rank_) + ": " + failure + "; the communicator was aborted");
      }
      lock.lock();
      if (failure.empty()) watch_cv_.wait_for(lock, kWatchdogPeriod, [&] { return stop_; });
    }
  }

  // NCCL's asynchronous error for the watchdog, "" when none (or when an operation holds the
  // communicator: the next round looks again).
  std::string async_failure() {
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock() || aborted_ || comm_ == nullptr) return "";
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &async) != ncclSuccess) return "";
    if (async == ncclSuccess || async == ncclInProgress) return "";
    return "a peer failed during a collective: " + nccl_text(async);
  }

  // Aborts the communicator; why: the failure that made it necessary ("": the host asked).
  void fail(const std::string& why) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    fail_locked(why);
  }
  void fail_locked(const std::string& why) noexcept {
    if (aborted_) return;
    try {
      abort_reason_ = why;
    } catch (...) {
    }
    aborted_ = true;
    if (comm_ != nullptr) {
      (void)ncclCommAbort(comm_);
      comm_ = nullptr;
    }
  }

  Error aborted_error() {
    std::lock_guard<std::mutex> lock(mutex_);
    return aborted_error_locked();
  }
  Error aborted_error_locked() const {
    return Error(HASTEN_ERR_REMOTE, abort_reason_.empty()
                                        ? std::string("nccl: the communicator was aborted after an earlier failure")
                                        : "nccl: the communicator was aborted after an earlier failure: " + abort_reason_);
  }

  ncclComm_t live() const {
    if (aborted_) throw aborted_error_locked();
    if (comm_ == nullptr) throw Error(HASTEN_ERR_INVALID_USAGE, "nccl: init has not completed");
    return comm_;
  }

  static Work& work_of(hasten_work* handle) {
    if (handle == nullptr) throw Error(HASTEN_ERR_INVALID_ARGUMENT, "nccl: work is NULL");
    return *reinterpret_cast<Work*>(handle);
  }

  std::string options_;  // as create() received them: a group's instance gets the same
  hasten_comm_init init_{};
  int rank_ = 0, world_ = 1;
  int device_ = -1;  // this rank's CUDA ordinal; -1 until init picked it
  int64_t timeout_ms_ = 1800000;
  std::mutex mutex_;                // guards comm_, abort_reason_ and the NCCL calls on comm_
  ncclComm_t comm_ = nullptr;       // NULL before init and after an abort
  std::atomic<bool> aborted_{false};
  std::string abort_reason_;        // the failure that aborted it; "" when the host did
  cudaStream_t stream_ = nullptr;   // the comm stream (non-blocking)
  void* barrier_buffer_ = nullptr;  // one float on device_, for barrier()
  EventPool events_;                // every event of this communicator; destroyed after the body
  // The watchdog's.
  std::mutex watch_mutex_;  // guards watch_, stop_ and Work::watched, Work::orphaned
  std::condition_variable watch_cv_;
  std::vector<Work*> watch_;  // stream-ordered works not yet seen complete
  bool stop_ = false;
  std::thread watchdog_;
};

constexpr hasten_plugin_descriptor kNccl = hasten::sdk::comm_descriptor<NcclComm>(
    "nccl", "1.1", "GPU collectives over NCCL on CUDA streams");

}  // namespace

HASTEN_PLUGIN_LIBRARY(&kNccl)
