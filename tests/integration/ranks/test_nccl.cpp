// The nccl comm plugin, in two suites registered apart (tests/unit/CMakeLists.txt):
//
// - NcclChecks: what the plugin checks before it needs a GPU, so it runs anywhere: the buffer
//   checks (a CPU buffer, a buffer on another GPU, a strided view: require_cuda_compact) and
//   init's refusals (a device_id out of range, not an ordinal, a rank not of the run).
// - NcclGpu (ctest label gpu): every operation on real GPUs against a reference computed on
//   the host, at world size 1 and with one rank per GPU; the ordering of collectives after the
//   stream that produced their input; stream-ordered waits (ABI 1.6 work_wait_stream, and the
//   core's Work::wait on LibTorch's current stream) that do not block the host; an init whose
//   peer never arrives. Each skips (GTEST_SKIP, which ctest reports as skipped) without a CUDA
//   device.
//
// The GPU tests drive the plugin through the core's own host API. Anything that touches CUDA
// runs in a worker forked by hasten::launch: a process that initialised CUDA cannot fork
// workers that use it, so this process never calls CUDA itself (gpu_count() asks a child).
#include <hasten/launch.hpp>
#include <hasten/registry.hpp>

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm_instance.hpp"
#include "plugins/host_api.hpp"
#include "comm/plugin_communicator.hpp"
#include "launch/rendezvous.hpp"
#include "../../../plugins/comm/common/buffers.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

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

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

void cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// A DLTensor over caller-owned shape (and strides) arrays.
DLTensor dl(void* data, DLDevice device, std::vector<int64_t>& shape, int64_t* strides = nullptr) {
  DLTensor t{};
  t.data = data;
  t.device = device;
  t.ndim = static_cast<int32_t>(shape.size());
  t.dtype = {kDLFloat, 32, 1};
  t.shape = shape.data();
  t.strides = strides;
  return t;
}

// The message of what fn throws (hasten::sdk::Error from the checks, PluginError through the
// host), and its status for sdk::Error; fails when nothing is thrown.
struct Refusal {
  std::string message;
  hasten_status status = HASTEN_OK;
};
Refusal refusal(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const hasten::sdk::Error& e) {
    return {e.what(), e.status()};
  } catch (const std::exception& e) {
    return {e.what(), HASTEN_ERR_INTERNAL};
  }
  throw std::runtime_error("accepted, where a refusal was expected");
}

// ---- NcclChecks: no GPU needed ------------------------------------------------------------

// The checks themselves (common/buffers.hpp), exactly as the plugin calls them.
TEST(NcclChecks, RefusesBuffersItCannotReduce) {
  using hasten::comm::require_cuda_compact;
  float host[12] = {};
  std::vector<int64_t> shape{4, 3};

  // A CPU buffer, and pinned host memory: not device buffers.
  DLTensor cpu = dl(host, {kDLCPU, 0}, shape);
  Refusal r = refusal([&] { require_cuda_compact(cpu, 0, "nccl", "allreduce"); });
  EXPECT_EQ(r.status, HASTEN_ERR_UNSUPPORTED);
  EXPECT_TRUE(contains(r.message, "nccl allreduce: only CUDA buffers on cuda:0")) << r.message;
  EXPECT_TRUE(contains(r.message, "CPU (device type 1)")) << r.message;
  DLTensor pinned = dl(host, {kDLCUDAHost, 0}, shape);
  r = refusal([&] { require_cuda_compact(pinned, 0, "nccl", "broadcast"); });
  EXPECT_TRUE(contains(r.message, "nccl broadcast: only CUDA buffers on cuda:0 (got a buffer on CUDA host (pinned)"))
      << r.message;

  // A buffer on another GPU than the communicator's.
  DLTensor other = dl(host, {kDLCUDA, 1}, shape);
  r = refusal([&] { require_cuda_compact(other, 0, "nccl", "allgather"); });
  EXPECT_EQ(r.status, HASTEN_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(r.message, "nccl allgather: the buffer is on cuda:1, but this rank's communicator is on cuda:0 "
                                  "(only buffers on cuda:0 are allowed)"))
      << r.message;
  // Before init the communicator has no device: every CUDA buffer is refused, saying why.
  DLTensor on0 = dl(host, {kDLCUDA, 0}, shape);
  r = refusal([&] { require_cuda_compact(on0, -1, "nccl", "allreduce"); });
  EXPECT_TRUE(contains(r.message, "has no device yet (init has not completed)")) << r.message;

  // A strided view (a transpose): refused with the strides given and the ones allowed.
  int64_t transposed[] = {1, 4};
  DLTensor strided = dl(host, {kDLCUDA, 0}, shape, transposed);
  r = refusal([&] { require_cuda_compact(strided, 0, "nccl", "reduce_scatter"); });
  EXPECT_EQ(r.status, HASTEN_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(r.message, "nccl reduce_scatter: only dense row-major buffers (got shape [4, 3] with strides "
                                  "[1, 4]; allowed: strides NULL or [3, 1])"))
      << r.message;
  // Every other row: the right inner stride, a gap between rows.
  int64_t gapped[] = {6, 1};
  DLTensor rows = dl(host, {kDLCUDA, 0}, shape, gapped);
  EXPECT_TRUE(contains(refusal([&] { require_cuda_compact(rows, 0, "nccl", "allreduce"); }).message, "strides [6, 1]"));

  // Every refusal is one line.
  for (const DLTensor* t : {&cpu, &pinned, &other, &strided, &rows}) {
    const std::string m = refusal([&] { require_cuda_compact(*t, 0, "nccl", "allreduce"); }).message;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }

  // Accepted: strides NULL; the compact strides spelled out; any stride along an extent of 1;
  // a byte_offset (data_of honours it).
  EXPECT_NO_THROW(require_cuda_compact(on0, 0, "nccl", "allreduce"));
  int64_t compact[] = {3, 1};
  DLTensor spelled = dl(host, {kDLCUDA, 0}, shape, compact);
  EXPECT_NO_THROW(require_cuda_compact(spelled, 0, "nccl", "allreduce"));
  std::vector<int64_t> column{4, 1};
  int64_t any[] = {1, 99};
  DLTensor col = dl(host, {kDLCUDA, 0}, column, any);
  EXPECT_NO_THROW(require_cuda_compact(col, 0, "nccl", "allreduce"));
  DLTensor offset = dl(host, {kDLCUDA, 2}, shape);
  offset.byte_offset = 8;
  EXPECT_NO_THROW(require_cuda_compact(offset, 2, "nccl", "allreduce"));
  EXPECT_EQ(hasten::comm::data_of(offset), reinterpret_cast<char*>(host) + 8);

  // The CPU plugins' check is unchanged.
  EXPECT_NO_THROW(hasten::comm::require_cpu_compact(cpu, "shm", "allreduce"));
  DLTensor cpu_strided = dl(host, {kDLCPU, 0}, shape, transposed);
  EXPECT_TRUE(contains(refusal([&] { hasten::comm::require_cpu_compact(cpu_strided, "shm", "allreduce"); }).message,
                       "shm allreduce: buffers must be contiguous"));
}

// The loaded plugin runs those checks before any CUDA call: an instance that was never
// initialised (so has no GPU) refuses a CPU buffer and a strided view through the host.
TEST(NcclChecks, PluginChecksBuffersBeforeAnyCudaCall) {
  using namespace hasten::detail;
  HostContext host;
  CommInstance comm(hasten::PluginRegistry::instance().select(hasten::PluginKind::Comm, "nccl"), &host.api, "{}");
  EXPECT_TRUE(comm.supports_device(kDLCUDA));
  EXPECT_FALSE(comm.supports_device(kDLCPU));
  EXPECT_TRUE(comm.has_wait_stream());
  float x[6] = {};
  std::vector<int64_t> shape{2, 3};
  DLTensor cpu = dl(x, {kDLCPU, 0}, shape);
  std::string m = refusal([&] { comm.allreduce(cpu, HASTEN_REDUCE_SUM, nullptr); }).message;
  EXPECT_TRUE(contains(m, "nccl allreduce: only CUDA buffers")) << m;
  int64_t transposed[] = {1, 2};
  DLTensor strided = dl(x, {kDLCUDA, 0}, shape, transposed);
  m = refusal([&] { comm.broadcast(strided, 0, nullptr); }).message;
  EXPECT_TRUE(contains(m, "nccl broadcast: only dense row-major buffers")) << m;
  DLTensor out = dl(x, {kDLCUDA, 0}, shape);
  m = refusal([&] { comm.allgather(cpu, out, nullptr); }).message;
  EXPECT_TRUE(contains(m, "nccl allgather: only CUDA buffers")) << m;
}

// init refuses, with one line, what it can tell without a GPU. It runs in a worker: the
// device_id check counts the devices, which initialises CUDA in that process.
TEST(NcclChecks, InitRefusesADeviceItCannotUse) {
  hasten::LaunchOptions o;
  o.num_processes = 1;
  o.timeout_s = 120;
  hasten::launch(
      [] {
        using namespace hasten::detail;
        HostContext host;
        auto init_message = [&](int rank, int world, int32_t device_id) {
          CommInstance comm(hasten::PluginRegistry::instance().select(hasten::PluginKind::Comm, "nccl"), &host.api,
                            "{}");
          const std::string m = refusal([&] { comm.init(rank, world, 10000, 10000, "test/checks/", device_id); }).message;
          require(m.find('\n') == std::string::npos, "not one line: " + m);
          return m;
        };
        std::string m = init_message(0, 1, 4096);
        require(contains(m, "nccl: device_id 4096 is out of range: this process sees "), m);
        m = init_message(0, 1, -2);
        require(contains(m, "nccl: device_id -2 is not a CUDA ordinal"), m);
        m = init_message(3, 2, -1);
        require(contains(m, "nccl: rank 3 of world size 2 is not a rank of the run"), m);
      },
      o);
}

// ---- NcclGpu: on real GPUs ----------------------------------------------------------------

// Device memory of floats on the current device.
struct DeviceBuffer {
  explicit DeviceBuffer(const std::vector<float>& host) : n(host.size()) {
    cuda(cudaGetDevice(&device), "cudaGetDevice");
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
    t.device = {kDLCUDA, device};
    t.ndim = 1;
    t.dtype = {kDLFloat, 32, 1};
    shape = static_cast<int64_t>(n);
    t.shape = &shape;
    return t;
  }
  void* ptr = nullptr;
  size_t n;
  int device = 0;
  int64_t shape = 0;
};

// This worker's host context (the launcher's environment) and an nccl instance on it,
// initialised: one rank per GPU, device_id = the local rank (as the core passes it, ABI 1.6),
// which the plugin makes current on this thread.
struct NcclRank {
  explicit NcclRank(const std::string& store_prefix) {
    using namespace hasten::detail;
    host.process = hasten::detect_process_info(hasten::current_environment());
    host.timeout_ms = 60000;
    rank = host.process.rank;
    world = host.process.world_size;
    device = host.process.local_rank;
    if (world > 1) {
      store = rendezvous(host.process, host.timeout_ms);
      host.store = store.get();
    }
    comm = std::make_unique<CommInstance>(
        hasten::PluginRegistry::instance().select(hasten::PluginKind::Comm, "nccl"), &host.api, "{}");
    comm->init(rank, world, host.timeout_ms, host.timeout_ms, store_prefix, device);
  }
  hasten::detail::HostContext host;
  std::unique_ptr<hasten::detail::Store> store;
  std::unique_ptr<hasten::detail::CommInstance> comm;
  int rank = 0, world = 1, device = 0;
};

// Every operation against a host reference. stream_waits: each work is waited with
// work_wait_stream on the legacy default stream (what the synchronous reads below run on),
// freed at once, and read; otherwise with the blocking work_wait.
void every_operation(bool stream_waits) {
  NcclRank me(stream_waits ? "test/nccl_ops_stream/" : "test/nccl_ops/");
  auto& comm = *me.comm;
  const int r = me.rank, w = me.world;
  int current = -1;
  cuda(cudaGetDevice(&current), "cudaGetDevice");
  require(current == me.device, "init did not leave the rank's device current");
  require(comm.supports_device(kDLCUDA) && !comm.supports_device(kDLCPU), "nccl handles CUDA buffers only");
  require(comm.has_wait_stream(), "the nccl plugin has work_wait_stream (ABI 1.6)");
  auto value = [](int rank, size_t i) { return static_cast<float>((i % 5) * (rank + 1)); };
  const size_t n = 4096;
  std::vector<float> mine(n);
  for (size_t i = 0; i < n; ++i) mine[i] = value(r, i);
  auto done = [&](hasten_work* wk) {
    if (wk == nullptr) return;
    if (stream_waits)
      comm.wait_stream(wk, nullptr);  // the legacy default stream
    else
      comm.wait(wk, 0);
    comm.free(wk);
  };
  auto sum = [&](size_t i) {
    float s = 0;
    for (int k = 0; k < w; ++k) s += value(k, i);
    return s;
  };
  {
    DeviceBuffer b(mine);
    DLTensor v = b.view();
    done(comm.allreduce(v, HASTEN_REDUCE_SUM, nullptr));
    auto got = b.read();
    for (size_t i = 0; i < n; ++i) require(got[i] == sum(i), "allreduce sum");
  }
  {
    DeviceBuffer b(mine);
    DLTensor v = b.view();
    done(comm.allreduce(v, HASTEN_REDUCE_AVG, nullptr));
    auto got = b.read();
    for (size_t i = 0; i < n; ++i) {
      const float want = sum(i) / static_cast<float>(w);
      require(std::fabs(got[i] - want) <= 1e-6f * std::fabs(want) + 1e-6f,
              "allreduce avg: element " + std::to_string(i) + " is " + std::to_string(got[i]) + ", want " +
                  std::to_string(want));
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
  for (hasten_reduce_op op : {HASTEN_REDUCE_SUM, HASTEN_REDUCE_MAX}) {
    DeviceBuffer in(mine), out(std::vector<float>(n / static_cast<size_t>(w)));
    DLTensor a = in.view(), o = out.view();
    done(comm.reduce_scatter(a, o, op, nullptr));
    auto got = out.read();
    for (size_t i = 0; i < got.size(); ++i) {
      const size_t at = static_cast<size_t>(r) * got.size() + i;
      float want = op == HASTEN_REDUCE_SUM ? 0.0f : -INFINITY;
      for (int k = 0; k < w; ++k) want = op == HASTEN_REDUCE_SUM ? want + value(k, at) : std::max(want, value(k, at));
      require(got[i] == want, op == HASTEN_REDUCE_SUM ? "reduce_scatter sum" : "reduce_scatter max");
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
  cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
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

// Stream-ordered waits (ABI 1.6). The input is written on a producer stream behind a long
// stall; the collective is waited with work_wait_stream on a reader stream, and then a kernel
// on the reader stream (LibTorch's b * 2) reads the result. The wait and the free must return
// while the collective is still held up by the producer (the host is not blocked), and the
// kernel must see the reduced values (the reader stream waited): -2s mean it read the stale
// contents. Then the same through the core: the communicator orders the collective after
// LibTorch's current stream (the producer) and Work::wait orders the current stream (the
// reader), as DDP's and ZeRO's waits go.
void stream_wait_rank() {
  using namespace hasten::detail;
  NcclRank me("test/nccl_stream/");
  const int r = me.rank, w = me.world;
  const c10::Device dev(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(me.device));
  const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  const c10::Stream producer = impl->getStreamFromGlobalPool(dev, false);
  c10::Stream reader = impl->getStreamFromGlobalPool(dev, false);
  while (reader == producer) reader = impl->getStreamFromGlobalPool(dev, false);
  auto native = [](const c10::Stream& s) { return static_cast<cudaStream_t>(s.native_handle()); };
  const int64_t n = 1 << 20;
  const auto options = torch::TensorOptions().device(dev).dtype(torch::kFloat);
  const torch::Tensor source = torch::arange(n, options) + 1000.0 * r;
  torch::Tensor want = torch::zeros({n}, torch::kFloat);
  for (int k = 0; k < w; ++k) want += torch::arange(n, torch::kFloat) + 1000.0 * k;
  want *= 2;
  static int long_stall_ms = 1500;
  const double quick_ms = 500;  // far below the stall: the wait did not block on it
  auto view = [](torch::Tensor& t) {
    DLTensor v{};
    v.data = t.data_ptr();
    v.device = {kDLCUDA, static_cast<int32_t>(t.device().index())};
    v.ndim = 1;
    v.dtype = {kDLFloat, 32, 1};
    v.shape = const_cast<int64_t*>(t.sizes().data());
    return v;
  };
  // Fills b with the source on the producer, behind the stall.
  auto produce = [&](torch::Tensor& b) {
    c10::StreamGuard on(producer);
    cuda(cudaLaunchHostFunc(native(producer), stall, &long_stall_ms), "cudaLaunchHostFunc");
    b.copy_(source);
  };
  auto check = [&](const torch::Tensor& got, const std::string& what) {
    if (!torch::equal(got, want))
      throw std::runtime_error(what + ": the kernel on the waiting stream read " +
                               std::to_string(got[0].item<float>()) + ", " + std::to_string(got[n - 1].item<float>()) +
                               " at the ends, want " + std::to_string(want[0].item<float>()) + ", " +
                               std::to_string(want[n - 1].item<float>()) + " (-2: the stale contents)");
  };

  {  // The plugin's slot.
    auto& comm = *me.comm;
    torch::Tensor b = torch::full({n}, -1.0, options);
    cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    produce(b);
    hasten_coll_options o{};
    o.struct_size = sizeof o;
    o.abi_version = HASTEN_ABI_VERSION;
    o.stream = native(producer);
    DLTensor v = view(b);
    const auto start = Clock::now();
    hasten_work* wk = comm.allreduce(v, HASTEN_REDUCE_SUM, &o);
    require(wk != nullptr, "a collective held up by its producer came back complete");
    comm.wait_stream(wk, native(reader));
    const double waited = ms_since(start);
    require(waited < quick_ms, "work_wait_stream blocked the host for " + std::to_string(waited) + " ms");
    require(!comm.test(wk), "the collective completed while its producer stream was stalled");
    const auto freeing = Clock::now();
    comm.free(wk);  // before it completed: the plugin's watchdog keeps it
    require(ms_since(freeing) < quick_ms, "work_free after work_wait_stream blocked the host");
    torch::Tensor got;
    {
      c10::StreamGuard on(reader);
      got = (b * 2).cpu();  // a kernel on the reader stream, then a copy there
    }
    check(got, "work_wait_stream");
  }
  // The core: Communicator::allreduce after the current stream (the producer), Work::wait on
  // the current stream then (a pool stream, and LibTorch's default stream, whose handle is
  // NULL: the legacy default stream).
  auto communicator = make_plugin_communicator(r, w, nullptr, std::move(me.comm), std::make_shared<CommCounters>(), false);
  const c10::Stream default_stream = impl->getDefaultStream(dev);
  for (const auto& [waiter, name] : {std::pair{reader, "a pool stream"}, std::pair{default_stream, "the default stream"}}) {
    const std::string what = std::string("the core's Work::wait on ") + name;
    torch::Tensor b = torch::full({n}, -1.0, options);
    cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    WorkPtr work;
    {
      c10::StreamGuard on(producer);
      produce(b);
      DLTensor v = view(b);
      work = communicator->allreduce(v, HASTEN_REDUCE_SUM, nullptr);  // after the producer: current
    }
    require(work != nullptr, "a collective held up by its producer came back complete");
    torch::Tensor got;
    {
      c10::StreamGuard on(waiter);
      const auto start = Clock::now();
      work->wait(0);
      require(ms_since(start) < quick_ms, what + " blocked the host");
      require(!work->test(), what + ": the collective completed while its producer stream was stalled");
      const auto freeing = Clock::now();
      work.reset();
      require(ms_since(freeing) < quick_ms, what + ": dropping the waited Work blocked the host");
      got = (b * 2).cpu();
    }
    check(got, what);
  }
  cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

// After init, on the rank's GPU: the buffer checks still come first.
void refusing_rank() {
  NcclRank me("test/nccl_refuse/");
  auto& comm = *me.comm;
  float x = 1;
  std::vector<int64_t> shape{1};
  DLTensor cpu = dl(&x, {kDLCPU, 0}, shape);
  std::string m = refusal([&] { comm.allreduce(cpu, HASTEN_REDUCE_SUM, nullptr); }).message;
  require(contains(m, "only CUDA buffers on cuda:" + std::to_string(me.device)), m);
  DeviceBuffer b(std::vector<float>(6, 1.0f));
  DLTensor elsewhere = b.view();
  elsewhere.device.device_id = me.device + 1;
  m = refusal([&] { comm.allreduce(elsewhere, HASTEN_REDUCE_SUM, nullptr); }).message;
  require(contains(m, "the buffer is on cuda:" + std::to_string(me.device + 1) + ", but this rank's communicator is on cuda:" +
                          std::to_string(me.device)),
          m);
  std::vector<int64_t> shape23{2, 3};
  int64_t transposed[] = {1, 2};
  DLTensor strided = dl(b.ptr, {kDLCUDA, me.device}, shape23, transposed);
  m = refusal([&] { comm.allreduce(strided, HASTEN_REDUCE_SUM, nullptr); }).message;
  require(contains(m, "only dense row-major buffers"), m);
}

// Two ranks; rank 1 never enters the comm's init. Rank 0's init must fail within its
// connect deadline, saying it timed out and that rank 1 never arrived. Rank 1 waits (on the
// store rank 0 hosts) until rank 0 has checked, and needs no GPU.
void init_timeout_rank() {
  using namespace hasten::detail;
  HostContext host;
  host.process = hasten::detect_process_info(hasten::current_environment());
  host.timeout_ms = 60000;
  auto store = rendezvous(host.process, host.timeout_ms);
  host.store = store.get();
  const std::string prefix = "test/nccl_init_timeout/";
  if (host.process.rank != 0) {
    (void)store->get(prefix + "checked", 60000);
    return;
  }
  constexpr int64_t kConnectMs = 3000;
  CommInstance comm(hasten::PluginRegistry::instance().select(hasten::PluginKind::Comm, "nccl"), &host.api, "{}");
  const auto start = Clock::now();
  std::string m;
  try {
    comm.init(0, 2, 60000, kConnectMs, prefix, 0);
  } catch (const std::exception& e) {
    m = e.what();
  }
  const double took = ms_since(start);
  store->set(prefix + "checked", {1});
  require(!m.empty(), "init returned although rank 1 never entered it");
  require(took < kConnectMs + 8000, "init failed only after " + std::to_string(took) + " ms (deadline " +
                                        std::to_string(kConnectMs) + " ms): " + m);
  require(contains(m, "NCCL initialisation timed out after 3000 ms"), m);
  require(contains(m, "ranks that never entered it: 1"), m);
  require(m.find('\n') == std::string::npos, "not one line: " + m);
}

// Runs fn on `n` ranks.
void on_ranks(int n, void (*fn)()) {
  hasten::LaunchOptions o;
  o.num_processes = n;
  o.timeout_s = 180;
  hasten::launch(fn, o);
}

}  // namespace

TEST(NcclGpu, EveryOperationOnOneRank) {
  if (gpu_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  on_ranks(1, [] { every_operation(false); });
  on_ranks(1, [] { every_operation(true); });
}

TEST(NcclGpu, EveryOperationWithOneRankPerGpu) {
  const int gpus = gpu_count();
  if (gpus == 0) GTEST_SKIP() << "no CUDA device on this machine";
  on_ranks(std::min(gpus, 8), [] { every_operation(false); });
  on_ranks(std::min(gpus, 8), [] { every_operation(true); });
}

TEST(NcclGpu, CollectivesWaitForTheProducingStream) {
  const int gpus = gpu_count();
  if (gpus == 0) GTEST_SKIP() << "no CUDA device on this machine";
  on_ranks(std::min(gpus, 2), ordered_rank);
}

TEST(NcclGpu, StreamWaitsDoNotBlockTheHost) {
  const int gpus = gpu_count();
  if (gpus == 0) GTEST_SKIP() << "no CUDA device on this machine";
  on_ranks(std::min(gpus, 2), stream_wait_rank);
}

TEST(NcclGpu, RefusesBuffersItCannotReduce) {
  if (gpu_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  on_ranks(1, refusing_rank);
}

TEST(NcclGpu, InitTimesOutWhenARankNeverArrives) {
  if (gpu_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  on_ranks(2, init_timeout_rank);
}
