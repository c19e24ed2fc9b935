// Comm plugin "mpi": collectives between the CPU processes of a run that mpirun (or srun with
// PMIx) started, over the MPI library's own transports (shared memory, TCP, InfiniBand where
// the cluster has it). C tier: it links libmpi, not LibTorch.
//
// Every operation is posted at once as MPI's non-blocking collective (MPI_Iallreduce,
// MPI_Iallgather, MPI_Ireduce_scatter_block, MPI_Ibcast, MPI_Ibarrier) on a communicator of
// its own (a duplicate of MPI_COMM_WORLD), in the order the host issues them, which is the
// same on every rank. Open MPI advances non-blocking collectives only inside MPI calls, so a
// progress thread tests the outstanding ones; a work item completes when its request does.
// MPI is initialised with MPI_THREAD_MULTIPLE (the host's threads post, the progress thread
// tests), and finalised when the process exits.
//
// MPI gives ranks only to processes its launcher started: under hasten launch or torchrun
// each process would be a world of its own, which init refuses in one line.
#include <hasten/plugin.hpp>

// The C API only: Open MPI's deprecated C++ bindings would need libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "buffers.hpp"
#include "reduce_kernels.hpp"

namespace {

using hasten::comm::data_of;
using hasten::comm::element_size;
using hasten::comm::elements;
using hasten::sdk::Error;
using Clock = std::chrono::steady_clock;

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(len));
}

void check(int code, const std::string& what) {
  if (code != MPI_SUCCESS) throw Error(HASTEN_ERR_REMOTE, "mpi: " + what + " failed: " + mpi_error(code));
}

std::string thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    default: return "MPI_THREAD_MULTIPLE";
  }
}

// Set once a communicator failed or was aborted: requests may be outstanding that will never
// complete, and MPI_Finalize (a barrier across the job in Open MPI) would wait for peers that
// may be hung. The exit handler then ends the job with MPI_Abort instead, so that no rank
// blocks at exit and mpirun reports the failure.
std::atomic<bool> g_unclean{false};

// MPI once per process: initialised by the first communicator (or by the program itself,
// which must then have asked for MPI_THREAD_MULTIPLE), finalised at exit when hasten
// initialised it. hasten never unloads a plugin, so the exit handler's code stays mapped.
void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (g_unclean.load()) {
    MPI_Abort(MPI_COMM_WORLD, 1);
    return;
  }
  MPI_Finalize();
}

void ensure_mpi() {
  static std::once_flag once;
  static std::string failure;
  std::call_once(once, [] {
    int initialized = 0, provided = MPI_THREAD_SINGLE;
    MPI_Initialized(&initialized);
    if (initialized) {
      MPI_Query_thread(&provided);
    } else {
      const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      if (rc != MPI_SUCCESS) {
        failure = "mpi: MPI_Init_thread failed: " + mpi_error(rc);
        return;
      }
      std::atexit(finalize_at_exit);
    }
    // Errors come back as codes, named in the work's message, instead of aborting the job.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (provided < MPI_THREAD_MULTIPLE)
      failure = "mpi: the MPI library gives thread level " + thread_level_name(provided) +
                "; the plugin needs MPI_THREAD_MULTIPLE (its progress thread tests while training threads post): "
                "use an MPI built with thread support (Open MPI's is), or choose comm gloo or shm";
  });
  if (!failure.empty()) throw Error(HASTEN_ERR_UNSUPPORTED, failure);
}

// The MPI type of a buffer, and the op; float16 and bfloat16 (no MPI type) reduce as 16-bit
// words through user ops that compute in float32, as the other CPU plugins do.
template <class Op, bool kBf16>
void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  const Op op;
  for (int i = 0; i < *len; ++i) {
    const float x = kBf16 ? hasten::comm::bf16_to_float(b[i]) : hasten::comm::half_to_float(b[i]);
    const float y = kBf16 ? hasten::comm::bf16_to_float(a[i]) : hasten::comm::half_to_float(a[i]);
    b[i] = kBf16 ? hasten::comm::float_to_bf16(op(x, y)) : hasten::comm::float_to_half(op(x, y));
  }
}

struct HalfOps {
  MPI_Op ops[2][3];  // [bf16][sum, min, max]
  HalfOps() {
    MPI_Op_create(&half_op<hasten::comm::Sum, false>, 1, &ops[0][0]);
    MPI_Op_create(&half_op<hasten::comm::Min, false>, 1, &ops[0][1]);
    MPI_Op_create(&half_op<hasten::comm::Max, false>, 1, &ops[0][2]);
    MPI_Op_create(&half_op<hasten::comm::Sum, true>, 1, &ops[1][0]);
    MPI_Op_create(&half_op<hasten::comm::Min, true>, 1, &ops[1][1]);
    MPI_Op_create(&half_op<hasten::comm::Max, true>, 1, &ops[1][2]);
  }
};

struct Reduction {
  MPI_Datatype type;
  MPI_Op op;
};

Reduction reduction_of(const DLDataType& dtype, hasten_reduce_op op) {
  (void)hasten::comm::reduce_kernel(dtype, op);  // validates dtype and op with the other plugins' words
  const int k = op == HASTEN_REDUCE_MIN ? 1 : op == HASTEN_REDUCE_MAX ? 2 : 0;  // AVG: SUM, then divide
  static const MPI_Op native[3] = {MPI_SUM, MPI_MIN, MPI_MAX};
  switch (hasten::comm::type_of(dtype)) {
    case hasten::comm::Type::F32: return {MPI_FLOAT, native[k]};
    case hasten::comm::Type::F64: return {MPI_DOUBLE, native[k]};
    case hasten::comm::Type::I64: return {MPI_INT64_T, native[k]};
    case hasten::comm::Type::I32: return {MPI_INT32_T, native[k]};
    case hasten::comm::Type::F16:
    case hasten::comm::Type::BF16: {
      static const HalfOps half;  // after MPI_Init: built on first use
      return {MPI_UINT16_T, half.ops[hasten::comm::type_of(dtype) == hasten::comm::Type::BF16][k]};
    }
  }
  throw Error(HASTEN_ERR_UNSUPPORTED, "mpi: unsupported dtype");
}

int count_of(size_t n, const char* what) {
  if (n > static_cast<size_t>(INT_MAX))
    throw Error(HASTEN_ERR_UNSUPPORTED, std::string("mpi ") + what + ": " + std::to_string(n) +
                                            " elements exceed MPI's int count (2^31 - 1); split the tensor");
  return static_cast<int>(n);
}

// One posted operation.
struct Work {
  std::string what;  // "allreduce of 272 bytes", for messages
  MPI_Request request = MPI_REQUEST_NULL;
  std::function<void()> finish;  // after completion, on the progress thread (AVG's division)
  bool done = false;
  hasten_status status = HASTEN_OK;
  std::string message;
};

class MpiComm final : public hasten::sdk::Comm {
 public:
  explicit MpiComm(const hasten_host_api* host, std::string_view options) : Comm(host) {
    const hasten::sdk::Options o(host, options, "mpi", {});  // no options: anything given is an error
    (void)o;
  }

  ~MpiComm() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (progress_.joinable()) progress_.join();
    // Requests still outstanding (an aborted run) are left to MPI_Finalize: their buffers
    // belong to the host, which is ending.
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm_ != MPI_COMM_NULL && !finalized && active_.empty()) MPI_Comm_free(&comm_);
  }

  void init(const hasten_comm_init& init) override {
    ensure_mpi();
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank != init.rank || size != init.world_size)
      throw Error(HASTEN_ERR_INVALID_USAGE,
                  "mpi: MPI sees this process as rank " + std::to_string(rank) + " of " + std::to_string(size) +
                      ", hasten as rank " + std::to_string(init.rank) + " of " + std::to_string(init.world_size) +
                      ": the mpi comm plugin needs processes that mpirun (or srun) started, one per rank "
                      "(`mpirun -np " + std::to_string(init.world_size) + " PROGRAM`); under hasten launch or "
                      "torchrun choose comm gloo or shm");
    rank_ = rank;
    world_ = size;
    timeout_ms_ = init.timeout_ms > 0 ? init.timeout_ms : 1800000;
    check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");  // collective: every rank is here
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    progress_ = std::thread([this] { progress(); });
  }

  // ABI 1.11: MPI_Comm_split of this communicator (collective over it, as the host's split is):
  // the members of a color, ordered by their rank in the group.
  Comm* split(const hasten_comm_split& split) override {
    MPI_Comm sub = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, split.color, split.rank, &sub), "MPI_Comm_split");
    int rank = 0, size = 0;
    MPI_Comm_rank(sub, &rank);
    MPI_Comm_size(sub, &size);
    if (rank != split.rank || size != split.size) {
      MPI_Comm_free(&sub);
      throw Error(HASTEN_ERR_INVALID_ARGUMENT, "mpi: the group of color " + std::to_string(split.color) + " has " +
                                                   std::to_string(size) + " members and this rank is " +
                                                   std::to_string(rank) + " in it; the host asked for rank " +
                                                   std::to_string(split.rank) + " of " + std::to_string(split.size));
    }
    auto group = std::make_unique<MpiComm>(host(), "{}");
    group->adopt(sub, timeout_ms_);
    return group.release();
  }

  bool supports_device(int32_t device_type) override { return device_type == kDLCPU; }

  hasten_work* allreduce(DLTensor& buffer, hasten_reduce_op op, const hasten_coll_options*) override {
    hasten::comm::require_cpu_compact(buffer, "mpi", "allreduce");
    const Reduction r = reduction_of(buffer.dtype, op);
    const size_t n = elements(buffer);
    char* ptr = data_of(buffer);
    const DLDataType dtype = buffer.dtype;
    const int world = world_;
    const int count = count_of(n, "allreduce");
    return post("allreduce of " + std::to_string(n * element_size(buffer)) + " bytes",
                [=](MPI_Request* req) { return MPI_Iallreduce(MPI_IN_PLACE, ptr, count, r.type, r.op, comm_, req); },
                op == HASTEN_REDUCE_AVG ? std::function<void()>([=] { hasten::comm::divide(ptr, n, dtype, world); })
                                        : std::function<void()>());
  }

  hasten_work* allgather(const DLTensor& input, DLTensor& output, const hasten_coll_options*) override {
    hasten::comm::require_cpu_compact(input, "mpi", "allgather");
    hasten::comm::require_cpu_compact(output, "mpi", "allgather");
    const size_t in_bytes = elements(input) * element_size(input);
    if (elements(output) * element_size(output) != in_bytes * static_cast<size_t>(world_))
      throw Error(HASTEN_ERR_INVALID_ARGUMENT, "mpi allgather: output holds " +
                                                   std::to_string(elements(output) * element_size(output)) +
                                                   " bytes, expected world_size x input = " +
                                                   std::to_string(in_bytes * static_cast<size_t>(world_)));
    const char* in = data_of(input);
    char* out = data_of(output);
    const int count = count_of(in_bytes, "allgather (bytes per rank)");
    return post("allgather of " + std::to_string(in_bytes) + " bytes", [=](MPI_Request* req) {
      return MPI_Iallgather(in, count, MPI_BYTE, out, count, MPI_BYTE, comm_, req);
    });
  }

  hasten_work* reduce_scatter(const DLTensor& input, DLTensor& output, hasten_reduce_op op,
                              const hasten_coll_options*) override {
    hasten::comm::require_cpu_compact(input, "mpi", "reduce_scatter");
    hasten::comm::require_cpu_compact(output, "mpi", "reduce_scatter");
    const Reduction r = reduction_of(input.dtype, op);
    const size_t n = elements(input);
    if (n % static_cast<size_t>(world_) != 0 || elements(output) * static_cast<size_t>(world_) != n)
      throw Error(HASTEN_ERR_INVALID_ARGUMENT,
                  "mpi reduce_scatter: input of " + std::to_string(n) + " elements must be world_size (" +
                      std::to_string(world_) + ") x output (" + std::to_string(elements(output)) + ")");
    const char* in = data_of(input);
    char* out = data_of(output);
    const size_t chunk = n / static_cast<size_t>(world_);
    const int count = count_of(chunk, "reduce_scatter");
    const DLDataType dtype = input.dtype;
    const int world = world_;
    return post("reduce_scatter of " + std::to_string(n * element_size(input)) + " bytes",
                [=](MPI_Request* req) { return MPI_Ireduce_scatter_block(in, out, count, r.type, r.op, comm_, req); },
                op == HASTEN_REDUCE_AVG ? std::function<void()>([=] { hasten::comm::divide(out, chunk, dtype, world); })
                                        : std::function<void()>());
  }

  hasten_work* broadcast(DLTensor& buffer, int32_t root, const hasten_coll_options*) override {
    hasten::comm::require_cpu_compact(buffer, "mpi", "broadcast");
    if (root < 0 || root >= world_)
      throw Error(HASTEN_ERR_INVALID_ARGUMENT,
                  "mpi broadcast: root " + std::to_string(root) + " outside [0, " + std::to_string(world_) + ")");
    const size_t bytes = elements(buffer) * element_size(buffer);
    char* ptr = data_of(buffer);
    const int count = count_of(bytes, "broadcast (bytes)");
    return post("broadcast of " + std::to_string(bytes) + " bytes from rank " + std::to_string(root),
                [=](MPI_Request* req) { return MPI_Ibcast(ptr, count, MPI_BYTE, root, comm_, req); });
  }

  hasten_work* barrier(const hasten_coll_options*) override {
    return post("barrier", [=](MPI_Request* req) { return MPI_Ibarrier(comm_, req); });
  }

  void wait(hasten_work* handle, int64_t timeout_ms) override {
    Work* w = reinterpret_cast<Work*>(handle);
    const int64_t limit = timeout_ms > 0 ? timeout_ms : timeout_ms_;
    std::unique_lock<std::mutex> lock(mutex_);
    if (!done_.wait_for(lock, std::chrono::milliseconds(limit), [&] { return w->done || aborted_; }))
      throw Error(HASTEN_ERR_TIMEOUT, "mpi: rank " + std::to_string(rank_) + ": " + w->what + " did not complete within " +
                                          std::to_string(limit / 1000.0) + " s (a peer is hung or gone)");
    if (!w->done) throw Error(HASTEN_ERR_REMOTE, "mpi: rank " + std::to_string(rank_) + ": " + w->what + ": " + why_aborted());
    if (w->status != HASTEN_OK) throw Error(w->status, w->message);
  }

  bool test(hasten_work* handle) override {
    Work* w = reinterpret_cast<Work*>(handle);
    std::lock_guard<std::mutex> lock(mutex_);
    if (!w->done && aborted_) throw Error(HASTEN_ERR_REMOTE, "mpi: rank " + std::to_string(rank_) + ": " + w->what + ": " + why_aborted());
    if (w->done && w->status != HASTEN_OK) throw Error(w->status, w->message);
    return w->done;
  }

  void free_work(hasten_work* handle) noexcept override {
    Work* w = reinterpret_cast<Work*>(handle);
    if (w == nullptr) return;
    std::unique_lock<std::mutex> lock(mutex_);
    // MPI may still write into the buffers until the request completes: wait for it, within
    // the timeout. A request that outlives it, or an aborted communicator, stops the progress
    // thread (no MPI call touches the request again) and the item is left behind: the run is
    // over, and the exit handler ends the job.
    done_.wait_for(lock, std::chrono::milliseconds(timeout_ms_), [&] { return w->done || aborted_; });
    if (w->done) {
      delete w;
      return;
    }
    if (!aborted_) {
      aborted_ = true;
      first_error_ = "mpi: rank " + std::to_string(rank_) + ": " + w->what + " was dropped and did not complete within " +
                     std::to_string(timeout_ms_ / 1000.0) + " s";
    }
    g_unclean = true;
    w->finish = nullptr;  // nothing runs on the host's buffers any more
    done_.notify_all();
  }

  void abort() noexcept override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      aborted_ = true;
      if (first_error_.empty()) first_error_ = "the host aborted the communicator after a failed wait";
    }
    g_unclean = true;
    done_.notify_all();
  }

 private:
  hasten_work* post(std::string what, const std::function<int(MPI_Request*)>& start,
                    std::function<void()> finish = {}) {
    auto* w = new Work();
    w->what = std::move(what);
    w->finish = std::move(finish);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (comm_ == MPI_COMM_NULL) {
        delete w;
        throw Error(HASTEN_ERR_INVALID_USAGE, "mpi: collective before init");
      }
      if (aborted_ || broken_) {
        delete w;
        throw Error(HASTEN_ERR_REMOTE, "mpi: " + why_aborted());
      }
      // Posted under the lock: the order of posts is the order the host issued them.
      const int rc = start(&w->request);
      if (rc != MPI_SUCCESS) {
        const std::string message = "mpi: rank " + std::to_string(rank_) + ": " + w->what + " failed: " + mpi_error(rc);
        delete w;
        throw Error(HASTEN_ERR_REMOTE, message);
      }
      active_.push_back(w);
    }
    wake_.notify_one();
    return reinterpret_cast<hasten_work*>(w);
  }

  // Tests the outstanding requests in the order they were posted; between rounds that
  // complete nothing it backs off from yielding to sleeping (up to 200 us), so that an idle
  // wait costs little CPU and a busy one little latency.
  void progress() {
    int idle_rounds = 0;
    for (;;) {
      std::vector<Work*> round;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || aborted_ || !active_.empty(); });
        // After an abort no MPI call touches the outstanding requests again. Stopping: once
        // nothing is outstanding, or when the outstanding ones outlive the timeout.
        if (aborted_) return;
        if (stopping_ && stop_deadline_ == Clock::time_point{})
          stop_deadline_ = Clock::now() + std::chrono::milliseconds(timeout_ms_);
        if (active_.empty()) return;
        if (stopping_ && Clock::now() > stop_deadline_) {
          g_unclean = true;
          return;
        }
        round.assign(active_.begin(), active_.end());
      }
      bool any = false;
      for (Work* w : round) {
        int flag = 0;
        const int rc = MPI_Test(&w->request, &flag, MPI_STATUS_IGNORE);
        if (rc == MPI_SUCCESS && !flag) continue;
        any = true;
        hasten_status status = HASTEN_OK;
        std::string message;
        std::function<void()> finish;
        {
          std::lock_guard<std::mutex> lock(mutex_);
          finish = std::move(w->finish);  // cleared by free_work when the host let the item go
        }
        if (rc != MPI_SUCCESS) {
          status = HASTEN_ERR_REMOTE;
          message = "mpi: rank " + std::to_string(rank_) + ": " + w->what + " failed: " + mpi_error(rc);
        } else if (finish) {
          finish();
        }
        std::lock_guard<std::mutex> lock(mutex_);
        active_.remove(w);
        w->status = status;
        w->message = std::move(message);
        w->done = true;
        if (status != HASTEN_OK && !broken_) {
          broken_ = true;  // the ranks are out of step now: what follows fails promptly
          first_error_ = w->message;
          g_unclean = true;
        }
      }
      if (any) {
        done_.notify_all();
        idle_rounds = 0;
      } else if (++idle_rounds < 64) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(std::min(200, idle_rounds)));
      }
    }
  }

  // A group's communicator (split): owns `comm`, with the parent's deadline.
  void adopt(MPI_Comm comm, int64_t timeout_ms) {
    comm_ = comm;
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &world_);
    timeout_ms_ = timeout_ms;
    progress_ = std::thread([this] { progress(); });
  }

  std::string why_aborted() const {  // under mutex_
    return "communicator aborted after an earlier failure: " +
           (first_error_.empty() ? std::string("the host aborted it") : first_error_);
  }

  int rank_ = 0, world_ = 1;
  int64_t timeout_ms_ = 1800000;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::mutex mutex_;
  std::condition_variable wake_;  // the progress thread: work was posted, or stop
  std::condition_variable done_;  // waiters: a work completed, or abort
  std::list<Work*> active_;       // posted, not completed, in posting order
  bool stopping_ = false, aborted_ = false, broken_ = false;
  Clock::time_point stop_deadline_{};
  std::string first_error_;
  std::thread progress_;
};

constexpr hasten_plugin_descriptor kMpi = hasten::sdk::comm_descriptor<MpiComm>(
    "mpi", "1.0", "CPU collectives over MPI (Open MPI), for processes started by mpirun or srun; selected by comm: mpi");

}  // namespace

HASTEN_PLUGIN_LIBRARY(&kMpi)
