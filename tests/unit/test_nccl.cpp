// The nccl comm plugin on real GPUs: every operation against a reference computed on the host,
// and the ordering of collectives after the stream that produced their input.
// It needs CUDA devices (one rank per GPU, up to two) and skips cleanly without them. It
// drives the plugin through the core's own host API, since this machine's LibTorch is a CPU
// build and cannot make CUDA tensors.
#include <hasten/launch.hpp>
#include <hasten/registry.hpp>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "../../core/src/comm_instance.hpp"
#include "../../core/src/host_api.hpp"
#include "../../core/src/rendezvous.hpp"

namespace {

// The number of CUDA devices, counted in a child process: cudaGetDeviceCount initialises the
// CUDA driver, and a process that did so cannot fork workers that use CUDA (hasten::launch
// forks), so this process never calls CUDA itself.
int gpu_count() {
  int fds[2];
  if (::pipe(fds) != 0) return 0;
  const pid_t pid = ::fork();
  if (pid == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    const ssize_t wrote = ::write(fds[1], &n, sizeof n);
    ::_exit(wrote == static_cast<ssize_t>(sizeof n) ? 0 : 1);
  }
  ::close(fds[1]);
  int n = 0;
  const ssize_t got = pid > 0 ? ::read(fds[0], &n, sizeof n) : 0;
  ::close(fds[0]);
  if (pid > 0) ::waitpid(pid, nullptr, 0);
  return got == static_cast<ssize_t>(sizeof n) ? n : 0;
}

void require(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

void cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

struct DeviceBuffer {
  explicit DeviceBuffer(const std::vector<float>& host) : n(host.size()) {
    cuda(cudaMalloc(&ptr, n * sizeof(float)), "cudaMalloc");
    cuda(cudaMemcpy(ptr, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  // On the legacy default stream, synchronously.
  std::vector<float> read() const {
    std::vector<float> out(n);
    cuda(cudaMemcpy(out.data(), ptr, n * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return out;
  }
  // On `stream`, which nothing orders after any other stream.
  std::vector<float> read_on(cudaStream_t stream) const {
    std::vector<float> out(n);
    cuda(cudaMemcpyAsync(out.data(), ptr, n * sizeof(float), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
    cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return out;
  }
  DLTensor view() {
    DLTensor t{};
    t.data = ptr;
    t.device = {kDLCUDA, 0};
    t.ndim = 1;
    t.dtype = {kDLFloat, 32, 1};
    shape = static_cast<int64_t>(n);
    t.shape = &shape;
    return t;
  }
  void* ptr = nullptr;
  size_t n;
  int64_t shape = 0;
};

// This worker's host context (the launcher's environment) and an nccl instance on it,
// initialised: one rank per GPU, the rank's GPU current on this thread.
struct NcclRank {
  explicit NcclRank(const std::string& store_prefix) {
    using namespace hasten::detail;
    host.process = hasten::detect_process_info(hasten::current_environment());
    host.timeout_ms = 60000;
    rank = host.process.rank;
    world = host.process.world_size;
    if (world > 1) {
      store = rendezvous(host.process, host.timeout_ms);
      host.store = store.get();
    }
    comm = std::make_unique<CommInstance>(
        hasten::PluginRegistry::instance().select(hasten::PluginKind::Comm, "nccl"), &host.api, "{}");
    comm->init(rank, world, host.timeout_ms, host.timeout_ms, store_prefix);
  }
  hasten::detail::HostContext host;
  std::unique_ptr<hasten::detail::Store> store;
  std::unique_ptr<hasten::detail::CommInstance> comm;
  int rank = 0, world = 1;
};

void run_rank() {
  NcclRank me("test/nccl/");
  auto& comm = *me.comm;
  const int r = me.rank, w = me.world;
  require(comm.supports_device(kDLCUDA) && !comm.supports_device(kDLCPU), "nccl handles CUDA buffers only");
  auto value = [](int rank, size_t i) { return static_cast<float>((i % 5) * (rank + 1)); };
  const size_t n = 4096;
  std::vector<float> mine(n);
  for (size_t i = 0; i < n; ++i) mine[i] = value(r, i);
  auto done = [&](hasten_work* wk) {
    comm.wait(wk, 0);
    comm.free(wk);
  };
  {
    DeviceBuffer b(mine);
    DLTensor v = b.view();
    done(comm.allreduce(v, HASTEN_REDUCE_SUM, nullptr));
    auto got = b.read();
    for (size_t i = 0; i < n; ++i) {
      float want = 0;
      for (int k = 0; k < w; ++k) want += value(k, i);
      require(got[i] == want, "allreduce sum");
    }
  }
  {
    DeviceBuffer in(mine), out(std::vector<float>(n * static_cast<size_t>(w)));
    DLTensor a = in.view(), o = out.view();
    done(comm.allgather(a, o, nullptr));
    auto got = out.read();
    for (int k = 0; k < w; ++k)
      for (size_t i = 0; i < n; ++i) require(got[static_cast<size_t>(k) * n + i] == value(k, i), "allgather");
  }
  {
    DeviceBuffer in(mine), out(std::vector<float>(n / static_cast<size_t>(w)));
    DLTensor a = in.view(), o = out.view();
    done(comm.reduce_scatter(a, o, HASTEN_REDUCE_MAX, nullptr));
    auto got = out.read();
    for (size_t i = 0; i < got.size(); ++i) {
      float want = -INFINITY;
      for (int k = 0; k < w; ++k) want = std::max(want, value(k, static_cast<size_t>(r) * got.size() + i));
      require(got[i] == want, "reduce_scatter max");
    }
  }
  {
    DeviceBuffer b(mine);
    DLTensor v = b.view();
    done(comm.broadcast(v, w - 1, nullptr));
    auto got = b.read();
    for (size_t i = 0; i < n; ++i) require(got[i] == value(w - 1, i), "broadcast");
  }
  done(comm.barrier(nullptr));
}

// Stands in for a long kernel on a stream (this file is built by the host compiler and
// launches no kernels of its own): the stream runs nothing behind it for stall_ms.
int stall_ms = 300;
void CUDART_CB stall(void* ms) { std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(ms))); }

// Ordering against the producing stream, the bug a comm stream of its own invites. Right
// before each allreduce, the buffer's contents are written on the producer stream behind a
// stall; the buffer held stale values (-1) until then. The producers: a non-blocking stream
// passed in the options (what LibTorch's current stream is when it is not the default one:
// its pool streams are non-blocking), and the legacy default stream with NULL options.
// Results are read, once the work was waited on (or freed), on a third stream that nothing
// orders after the producer: so a collective that ran before the producer's write (on the
// stale values), or a wait that returned before the collective ended, shows as -1s even with
// one rank, where an in-place allreduce leaves the buffer as it is.
void ordered_rank() {
  NcclRank me("test/nccl_order/");
  auto& comm = *me.comm;
  const int r = me.rank, w = me.world;
  const size_t n = 1 << 20;
  auto fresh = [](int rank, size_t i, int k) { return static_cast<float>((i % 7) + 10 * k + 100 * rank); };
  auto want = [&](size_t i, int k) {
    float sum = 0;
    for (int q = 0; q < w; ++q) sum += fresh(q, i, k);
    return sum;
  };
  // Writes the k-th fresh contents into `target` on `producer`, behind a stall, and checks
  // that the producer is still busy: a collective issued now that does not wait for it runs
  // on the stale values.
  auto produce = [&](DeviceBuffer& target, DeviceBuffer& source, cudaStream_t producer) {
    cuda(cudaLaunchHostFunc(producer, stall, &stall_ms), "cudaLaunchHostFunc");
    cuda(cudaMemcpyAsync(target.ptr, source.ptr, n * sizeof(float), cudaMemcpyDeviceToDevice, producer),
         "cudaMemcpyAsync");
    require(cudaStreamQuery(producer) == cudaErrorNotReady, "the producer stream finished before the collective");
  };
  cudaStream_t side = nullptr, reader = nullptr;
  cuda(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  cuda(cudaStreamCreateWithFlags(&reader, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  auto check = [&](const DeviceBuffer& b, int k, const std::string& what) {
    const auto got = b.read_on(reader);
    for (size_t i = 0; i < n; ++i)
      if (got[i] != want(i, k))
        throw std::runtime_error(what + ": element " + std::to_string(i) + " is " + std::to_string(got[i]) +
                                 ", want " + std::to_string(want(i, k)) + " (-1: the stale contents)");
  };
  hasten_coll_options on_side{};
  on_side.struct_size = sizeof on_side;
  on_side.abi_version = HASTEN_ABI_VERSION;
  on_side.stream = side;
  struct Case {
    const char* name;
    cudaStream_t producer;
    const hasten_coll_options* options;
  };
  for (const Case& c : {Case{"options.stream", side, &on_side}, Case{"default stream", cudaStreamLegacy, nullptr}}) {
    // Several collectives in flight at once, waited on out of order, then every one checked;
    // then one freed without a wait. Every buffer is made first (its upload synchronises
    // with the legacy default stream, which must not happen between produce and collective).
    constexpr int kInFlight = 3;
    std::vector<std::unique_ptr<DeviceBuffer>> buffers, sources;
    for (int k = 0; k <= kInFlight; ++k) {
      std::vector<float> src(n);
      for (size_t i = 0; i < n; ++i) src[i] = fresh(r, i, k);
      sources.push_back(std::make_unique<DeviceBuffer>(src));
      buffers.push_back(std::make_unique<DeviceBuffer>(std::vector<float>(n, -1.0f)));
    }
    cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    std::vector<hasten_work*> works;
    for (int k = 0; k < kInFlight; ++k) {
      DeviceBuffer& b = *buffers[static_cast<size_t>(k)];
      produce(b, *sources[static_cast<size_t>(k)], c.producer);
      DLTensor v = b.view();
      works.push_back(comm.allreduce(v, HASTEN_REDUCE_SUM, c.options));
    }
    for (int k = kInFlight - 1; k >= 0; --k) comm.wait(works[static_cast<size_t>(k)], 0);
    for (hasten_work* wk : works) comm.free(wk);
    for (int k = 0; k < kInFlight; ++k)
      check(*buffers[static_cast<size_t>(k)], k, std::string(c.name) + ", allreduce " + std::to_string(k));
    // Freed without a wait: work_free waits first, so the result is there when it returns.
    DeviceBuffer& late = *buffers[kInFlight];
    produce(late, *sources[kInFlight], c.producer);
    DLTensor v = late.view();
    comm.free(comm.allreduce(v, HASTEN_REDUCE_SUM, c.options));
    check(late, kInFlight, std::string(c.name) + ", freed without a wait");
  }
  cuda(cudaStreamSynchronize(side), "cudaStreamSynchronize");
  cuda(cudaStreamDestroy(side), "cudaStreamDestroy");
  cuda(cudaStreamDestroy(reader), "cudaStreamDestroy");
}

// Runs fn on one rank per GPU, up to two.
void on_gpus(int gpus, void (*fn)()) {
  hasten::LaunchOptions o;
  o.num_processes = std::min(gpus, 2);
  o.timeout_s = 120;
  hasten::launch(fn, o);
}

}  // namespace

TEST(Nccl, EveryOperationOnTheGpus) {
  const int gpus = gpu_count();
  if (gpus == 0) GTEST_SKIP() << "no CUDA device on this machine";
  on_gpus(gpus, run_rank);
}

TEST(Nccl, CollectivesWaitForTheProducingStream) {
  const int gpus = gpu_count();
  if (gpus == 0) GTEST_SKIP() << "no CUDA device on this machine";
  on_gpus(gpus, ordered_rank);
}

TEST(Nccl, RefusesCpuBuffers) {
  if (gpu_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  hasten::LaunchOptions o;
  o.num_processes = 1;
  hasten::launch(
      [] {
        using namespace hasten::detail;
        HostContext host;
        CommInstance comm(hasten::PluginRegistry::instance().select(hasten::PluginKind::Comm, "nccl"), &host.api, "{}");
        comm.init(0, 1, 10000, 10000, "test/");
        float x = 1;
        int64_t shape = 1;
        DLTensor t{};
        t.data = &x;
        t.device = {kDLCPU, 0};
        t.ndim = 1;
        t.dtype = {kDLFloat, 32, 1};
        t.shape = &shape;
        try {
          comm.allreduce(t, HASTEN_REDUCE_SUM, nullptr);
        } catch (const hasten::PluginError& e) {
          require(std::string(e.what()).find("only CUDA buffers") != std::string::npos, e.what());
          return;
        }
        throw std::runtime_error("a CPU buffer was accepted");
      },
      o);
}
