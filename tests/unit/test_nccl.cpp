// The nccl comm plugin on real GPUs: every operation against a reference computed on the host.
// It needs CUDA devices (one rank per GPU, up to two) and skips cleanly without them. It
// drives the plugin through the core's own host API, since this machine's LibTorch is a CPU
// build and cannot make CUDA tensors.
#include <hasten/launch.hpp>
#include <hasten/registry.hpp>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "../../core/src/comm_instance.hpp"
#include "../../core/src/host_api.hpp"
#include "../../core/src/rendezvous.hpp"

namespace {

int gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

void require(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

struct DeviceBuffer {
  explicit DeviceBuffer(const std::vector<float>& host) : n(host.size()) {
    cudaMalloc(&ptr, n * sizeof(float));
    cudaMemcpy(ptr, host.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  std::vector<float> read() const {
    std::vector<float> out(n);
    cudaMemcpy(out.data(), ptr, n * sizeof(float), cudaMemcpyDeviceToHost);
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

void run_rank() {
  using namespace hasten::detail;
  HostContext host;
  host.process = hasten::detect_process_info(hasten::current_environment());
  host.timeout_ms = 60000;
  const int r = host.process.rank, w = host.process.world_size;
  std::unique_ptr<Store> store;
  if (w > 1) {
    store = rendezvous(host.process, host.timeout_ms);
    host.store = store.get();
  }
  CommInstance comm(hasten::PluginRegistry::instance().select(hasten::PluginKind::Comm, "nccl"), &host.api, "{}");
  require(comm.supports_device(kDLCUDA) && !comm.supports_device(kDLCPU), "nccl handles CUDA buffers only");
  comm.init(r, w, host.timeout_ms, "test/nccl/");
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

}  // namespace

TEST(Nccl, EveryOperationOnTheGpus) {
  const int gpus = gpu_count();
  if (gpus == 0) GTEST_SKIP() << "no CUDA device on this machine";
  hasten::LaunchOptions o;
  o.num_processes = std::min(gpus, 2);
  o.timeout_s = 120;
  hasten::launch(run_rank, o);
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
        comm.init(0, 1, 10000, "test/");
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
