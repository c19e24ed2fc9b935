// The core on CUDA (ctest label gpu): device per rank, ddp/zero3/fsdp against the same run on
// the CPU, bf16 autocast, fp16 loss scaling, checkpoints across devices, the memory report,
// the fork rule of hasten::launch, pinned worker batches copied non_blocking, activation
// checkpointing's recompute under CUDA dropout and autocast, and the profiler's CUDA kernels. Every test skips, with the reason, where the machine has
// fewer CUDA devices than it needs (ctest reads gtest's "[  SKIPPED ]").
//
// The test process itself never initialises CUDA before it forks ranks (hasten::launch refuses
// a process that has): the device count is asked of a child.
#include <hasten/hasten.hpp>
#include <hasten/torch_compat.hpp>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "workloads.hpp"

namespace {

using hasten::Accelerator;
using hasten::Options;
using hasten::test::require;
using hasten::test::TempDir;
using hasten::test::with_ranks;
namespace F = torch::nn::functional;

// CUDA devices this machine shows, counted in a child process.
int visible_gpus() {
  static const int n = [] {
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int count = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
      ::_exit(std::min(count, 100));
    }
    int status = 0;
    if (pid < 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 0;
    return WEXITSTATUS(status);
  }();
  return n;
}

#define REQUIRE_GPUS(n)                                                                                  \
  if (visible_gpus() < (n))                                                                              \
  GTEST_SKIP() << "needs " << (n) << " CUDA device" << ((n) == 1 ? "" : "s") << "; this machine has " \
               << visible_gpus()

Options isolated(Options o = {}) {
  hasten::test::isolate_home();
  return o;
}

// Comparisons with the CPU need float32 products in float32 (not TF32).
void strict_float32() {
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
}

struct Mlp : torch::nn::Module {
  Mlp() {
    torch::manual_seed(0);
    a = register_module("a", torch::nn::Linear(16, 32));
    b = register_module("b", torch::nn::Linear(32, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    last_hidden_dtype = a->forward(x).scalar_type();
    return b->forward(torch::relu(a->forward(x)));
  }
  torch::nn::Linear a{nullptr}, b{nullptr};
  at::ScalarType last_hidden_dtype = at::kFloat;
};

std::pair<torch::Tensor, torch::Tensor> data(int64_t n) {
  torch::manual_seed(1);
  return {torch::randn({n, 16}), torch::randint(0, 4, {n}, torch::kLong)};
}

torch::Tensor flat_params(torch::nn::Module& m) {
  std::vector<torch::Tensor> all;
  for (auto& p : m.parameters()) all.push_back(p.detach().to(torch::kCPU).reshape(-1));
  return torch::cat(all);
}

// `world` ranks train Mlp for 4 steps of Adam with `strategy`, on the GPUs or the CPU; rank 0
// writes the full parameters after training to `out`.
void train_and_save(const std::string& strategy, bool cpu, int world, const std::string& out) {
  std::map<std::string, std::string> env{{"HASTEN_STRATEGY", strategy}};
  if (cpu) env["HASTEN_USE_CPU"] = "true";
  hasten::launch(
      [out, cpu] {
        strict_float32();
        Accelerator acc;
        require(acc.device().is_cuda() != cpu, "device " + acc.device().str());
        auto net = std::make_shared<Mlp>();
        torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
        auto [x, y] = data(64);
        auto [model, opt, loader] = acc.prepare(net, adam, hasten::DataLoader(hasten::TensorDataset(x, y), {8}));
        int steps = 0;
        for (auto& batch : loader) {
          require(batch.input.device() == acc.device(), "batches arrive on the run's device");
          acc.backward(F::cross_entropy(model(batch.input), batch.target));
          opt.step();
          opt.zero_grad();
          if (++steps == 4) break;
        }
        auto full = acc.get_state_dict(model);
        for (auto& [name, t] : full) require(t.is_cpu(), "the full state dict is gathered to the CPU: " + name);
        if (acc.is_main_process()) {
          std::vector<torch::Tensor> all;
          for (auto& [name, t] : full) all.push_back(t.reshape(-1));
          torch::save(torch::cat(all), out);
        }
        acc.end_training();
      },
      with_ranks(world, env));
}

TEST(GpuDevice, EachRankGetsItsGpuAndMakesItCurrent) {
  REQUIRE_GPUS(1);
  const int world = std::min(visible_gpus(), 2);
  hasten::launch(
      [] {
        Accelerator acc;
        const int local = acc.local_process_index();
        require(acc.device() == torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local)),
                "rank " + std::to_string(local) + " got " + acc.device().str());
        require(c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice().index() == local,
                "the rank's GPU is the current device");
        require(torch::empty({1}, torch::kCUDA).device().index() == local, "allocations without an index land there");
      },
      with_ranks(world));
}

TEST(GpuDevice, GpuIdsPickTheDevice) {
  REQUIRE_GPUS(2);
  hasten::launch(
      [] {
        Accelerator acc;
        require(acc.device() == torch::Device(torch::kCUDA, 1), "gpu_ids 1 gives cuda:1, got " + acc.device().str());
      },
      with_ranks(1, {{"HASTEN_GPU_IDS", "1"}}));
}

TEST(GpuDevice, TwoRanksOnOneGpuAreRefusedWithOneLine) {
  REQUIRE_GPUS(1);
  hasten::launch(
      [] {
        try {
          Accelerator acc;
          require(false, "two ranks on gpu_ids 0 must be refused");
        } catch (const hasten::ConfigError& e) {
          require(std::string(e.what()).find("two ranks would share a GPU") != std::string::npos, e.what());
        }
      },
      with_ranks(2, {{"HASTEN_GPU_IDS", "0"}}));
}

// Same seed, data and steps on the GPU(s) and on the CPU: float32 products differ only in
// their summation order (cuBLAS vs MKL), so 4 Adam steps agree to 1e-5.
TEST(GpuStrategies, DdpZero3AndFsdpOnCudaMatchTheSameRunOnTheCpu) {
  REQUIRE_GPUS(1);
  const int world = std::min(visible_gpus(), 2);
  TempDir dir;
  for (const std::string strategy : {"ddp", "zero3", "fsdp"}) {
    const auto gpu = (dir.path() / (strategy + "-gpu.pt")).string();
    const auto cpu = (dir.path() / (strategy + "-cpu.pt")).string();
    train_and_save(strategy, false, world, gpu);
    train_and_save(strategy, true, world, cpu);
    torch::Tensor a, b;
    torch::load(a, gpu);
    torch::load(b, cpu);
    ASSERT_EQ(a.numel(), b.numel()) << strategy;
    EXPECT_LT((a - b).abs().max().item<double>(), 1e-5) << strategy << " on " << world << " GPU(s) vs the CPU";
  }
}

TEST(GpuPrecision, Bf16AutocastRunsTheForwardInBf16OnCuda) {
  REQUIRE_GPUS(1);
  strict_float32();
  Options o = isolated();
  o.mixed_precision = "bf16";
  Accelerator acc(o);
  ASSERT_TRUE(acc.device().is_cuda());
  auto net = std::make_shared<Mlp>();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  auto [model, opt] = acc.prepare(net, sgd);
  auto [x, y] = data(32);
  const auto loss = F::cross_entropy(model(x.to(acc.device())), y.to(acc.device()));
  EXPECT_EQ(net->last_hidden_dtype, at::kBFloat16) << "the linear layers ran under CUDA autocast";
  auto reference = std::make_shared<Mlp>();
  const auto expected = F::cross_entropy(reference->forward(x), y);
  EXPECT_NEAR(loss.item<double>(), expected.item<double>(), 2e-2) << "bf16 loss within bf16's precision of float32";
  acc.backward(loss);
  for (auto& p : net->parameters()) EXPECT_EQ(p.grad().scalar_type(), at::kFloat) << "gradients stay float32";
}

TEST(GpuPrecision, Fp16ScalerSkipsAnOverflowingStepAndBacksOff) {
  REQUIRE_GPUS(1);
  Options o = isolated();
  o.mixed_precision = "fp16";
  o.set = {{"precision_options", "{init_scale: 1024}"}};
  Accelerator acc(o);
  auto net = std::make_shared<Mlp>();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  auto [model, opt] = acc.prepare(net, sgd);
  auto [x, y] = data(32);
  x = x.to(acc.device());
  y = y.to(acc.device());
  acc.backward(F::cross_entropy(model(x), y));
  opt.step();
  EXPECT_FALSE(opt.step_was_skipped());
  opt.zero_grad();
  acc.backward(F::cross_entropy(model(x), y));
  net->a->weight.mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
  const auto before = net->a->weight.detach().clone();
  opt.step();
  EXPECT_TRUE(opt.step_was_skipped());
  EXPECT_TRUE(torch::equal(net->a->weight.detach(), before)) << "a skipped step leaves the weights";
  EXPECT_DOUBLE_EQ(acc.loss_scale(), 512.0);
}

// A checkpoint written on the GPU resumes a CPU run and back; Adam's state lands on the device
// of each run's parameters, not where it was saved.
TEST(GpuCheckpoint, SavedOnGpuLoadsOnCpuAndBack) {
  REQUIRE_GPUS(1);
  TempDir dir;
  auto [x, y] = data(32);
  auto train = [&](Accelerator& acc, auto& model, auto& opt) {
    acc.backward(F::cross_entropy(model(x.to(acc.device())), y.to(acc.device())));
    opt.step();
    opt.zero_grad();
  };
  auto adam_state_device = [](torch::optim::Adam& adam, const torch::Tensor& p) {
    auto it = adam.state().find(hasten::compat::state_key(p));
    return it == adam.state().end() ? torch::Device(torch::kMeta)
                                    : static_cast<torch::optim::AdamParamState&>(*it->second).exp_avg().device();
  };
  torch::Tensor on_gpu;
  {
    Accelerator acc(isolated());
    auto net = std::make_shared<Mlp>();
    torch::optim::Adam adam(net->parameters());
    auto [model, opt] = acc.prepare(net, adam);
    train(acc, model, opt);
    acc.save_state((dir.path() / "gpu").string());
    on_gpu = flat_params(*net);
  }
  torch::Tensor on_cpu;
  {
    Options o = isolated();
    o.cpu = true;
    Accelerator acc(o);
    auto net = std::make_shared<Mlp>();
    torch::optim::Adam adam(net->parameters());
    auto [model, opt] = acc.prepare(net, adam);
    acc.load_state((dir.path() / "gpu").string());
    EXPECT_TRUE(torch::equal(flat_params(*net), on_gpu)) << "the GPU's weights, on the CPU";
    EXPECT_TRUE(adam_state_device(adam, net->a->weight).is_cpu()) << "Adam's state on the CPU";
    train(acc, model, opt);
    acc.save_state((dir.path() / "cpu").string());
    on_cpu = flat_params(*net);
  }
  {
    Accelerator acc(isolated());
    auto net = std::make_shared<Mlp>();
    torch::optim::Adam adam(net->parameters());
    auto [model, opt] = acc.prepare(net, adam);
    acc.load_state((dir.path() / "cpu").string());
    EXPECT_TRUE(torch::equal(flat_params(*net), on_cpu)) << "the CPU's weights, on the GPU";
    EXPECT_EQ(adam_state_device(adam, net->a->weight), acc.device()) << "Adam's state on the rank's GPU";
  }
}

TEST(GpuMemory, TheReportCountsShardsOnCuda) {
  REQUIRE_GPUS(1);
  hasten::launch(
      [] {
        Accelerator acc;
        require(acc.device().is_cuda(), "a GPU run");
        auto net = std::make_shared<Mlp>();
        int64_t numel = 0;
        for (auto& p : net->parameters()) numel += p.numel();
        torch::optim::Adam adam(net->parameters());
        auto [model, opt] = acc.prepare(net, adam);
        auto [x, y] = data(16);
        acc.backward(F::cross_entropy(model(x.to(acc.device())), y.to(acc.device())));
        opt.step();
        opt.zero_grad();
        const auto r = acc.memory_report();
        require(r.params == 0, "zero3 holds no full parameters at rest: " + std::to_string(r.params));
        require(r.param_shards >= static_cast<uint64_t>(numel) * 4, "the float32 shard: " + std::to_string(r.param_shards));
        require(r.optimizer >= static_cast<uint64_t>(numel) * 8, "Adam's two moments: " + std::to_string(r.optimizer));
        require(r.peak_params > 0, "parameters were gathered for forward");
      },
      with_ranks(1, {{"HASTEN_STRATEGY", "zero3"}}));
}

// gpt-tiny's causal mask and positions are plain tensors (kept out of DDP's buffer broadcast):
// forward brings them to its input's device. (LibTorch cannot move a module to the meta device,
// so only a GPU shows this.)
TEST(GpuWorkloads, TinyGptRunsOnTheGpuItWasMovedTo) {
  REQUIRE_GPUS(1);
  torch::manual_seed(0);
  auto model = hasten::workloads::build_model("gpt-tiny");
  model->to(torch::kCUDA);
  const auto idx = torch::zeros({16, 2}, torch::TensorOptions().dtype(torch::kLong).device(torch::kCUDA));
  const auto out = model->forward(idx);
  EXPECT_TRUE(out.is_cuda());
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{16, 2, 96}));
}

// Worker threads, page-locked batches and non_blocking copies on CUDA: the copy of a batch from
// a pinned buffer runs on the stream while the host goes on, so a buffer reused or freed too
// early would show as other data. The losses are bitwise those of the plain loader's run.
TEST(GpuData, PinnedWorkerBatchesCopiedNonBlockingTrainLikeThePlainLoader) {
  REQUIRE_GPUS(1);
  strict_float32();
  auto losses = [](bool fast) {
    Accelerator acc(isolated());
    auto net = std::make_shared<Mlp>();
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
    auto [x, y] = data(512);
    hasten::DataLoaderOptions lo;
    lo.batch_size = 16;
    if (fast) {
      lo.num_workers = 2;
      lo.pin_memory = true;
      lo.non_blocking = true;
    }
    auto [model, opt, loader] = acc.prepare(net, sgd, hasten::DataLoader(hasten::TensorDataset(x, y), lo));
    std::vector<float> out;
    for (auto& batch : loader) {
      EXPECT_EQ(batch.input.device(), acc.device());
      auto loss = F::cross_entropy(model(batch.input), batch.target);
      acc.backward(loss);
      opt.step();
      opt.zero_grad();
      out.push_back(loss.item<float>());
    }
    return out;
  };
  const auto plain = losses(false);
  const auto fast = losses(true);
  ASSERT_EQ(plain.size(), 32u);
  EXPECT_EQ(plain, fast) << "num_workers 2 + pin_memory + non_blocking vs the plain loader, on CUDA";
}

// Activation checkpointing on CUDA under bf16 autocast, with dropout: the recompute replays the
// GPU's generator and CUDA autocast, so gradients are those of the run that kept activations.
struct DropBlockImpl : torch::nn::Module {
  DropBlockImpl() {
    fc = register_module("fc", torch::nn::Linear(32, 32));
    drop = register_module("drop", torch::nn::Dropout(0.3));
  }
  torch::Tensor forward(torch::Tensor x) { return x + drop(torch::tanh(fc(x))); }
  torch::nn::Linear fc{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(DropBlock);

struct DropNetImpl : torch::nn::Module {
  DropNetImpl() {
    torch::manual_seed(0);
    in = register_module("in", torch::nn::Linear(16, 32));
    for (int i = 0; i < 3; ++i) blocks.push_back(register_module("b" + std::to_string(i), hasten::Unit<DropBlock>()));
    out = register_module("out", torch::nn::Linear(32, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = in(x);
    for (auto& b : blocks) x = b(x);
    return out(x);
  }
  torch::nn::Linear in{nullptr}, out{nullptr};
  std::vector<hasten::Unit<DropBlock>> blocks;
};
TORCH_MODULE(DropNet);

TEST(GpuCheckpointing, RecomputeOnCudaReplaysDropoutAndBf16Autocast) {
  REQUIRE_GPUS(1);
  strict_float32();
  auto grads = [](bool checkpointed) {
    Options o = isolated();
    o.mixed_precision = "bf16";
    Accelerator acc(o);
    DropNet net;
    if (checkpointed) {
      EXPECT_EQ(acc.checkpoint_activations(net), 3u);
    }
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
    auto [model, opt] = acc.prepare(net, sgd);
    auto [x, y] = data(64);
    torch::manual_seed(7);  // the CUDA generator too: the dropout masks
    acc.backward(F::cross_entropy(model(x.to(acc.device())), y.to(acc.device())));
    std::vector<torch::Tensor> g;
    for (auto& p : net->parameters()) g.push_back(p.grad().detach().to(torch::kCPU).reshape(-1));
    return torch::cat(g);
  };
  const auto kept = grads(false);
  const auto recomputed = grads(true);
  EXPECT_TRUE(torch::equal(kept, recomputed))
      << "max difference " << (kept - recomputed).abs().max().item<double>() << " over " << kept.numel();
}

// The profiler on CUDA records the GPU's kernels (Kineto with CUPTI) beside hasten's ranges.
TEST(GpuProfiler, TheTraceHoldsCudaKernelsAndHastensRanges) {
  REQUIRE_GPUS(1);
  TempDir dir;
  const auto out = (dir.path() / "profile").string();
  {
    Options o = isolated();
    o.set = {{"profile", "{wait: 1, warmup: 1, active: 2, dir: " + out + "}"}};
    Accelerator acc(o);
    auto net = std::make_shared<Mlp>();
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
    auto [model, opt] = acc.prepare(net, sgd);
    auto [x, y] = data(32);
    for (int step = 0; step < 6; ++step) {
      acc.backward(F::cross_entropy(model(x.to(acc.device())), y.to(acc.device())));
      opt.step();
      opt.zero_grad();
    }
    acc.end_training();
  }
  std::vector<std::filesystem::path> traces;
  for (auto& e : std::filesystem::directory_iterator(out)) traces.push_back(e.path());
  ASSERT_EQ(traces.size(), 1u) << "one trace for the one rank in " << out;
  std::ifstream in(traces[0]);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto has = [&](const std::string& a, const std::string& b) {
    return text.find(a) != std::string::npos || text.find(b) != std::string::npos;
  };
  EXPECT_TRUE(has("\"cat\": \"kernel\"", "\"cat\":\"kernel\"")) << "no CUDA kernel event in " << traces[0];
  EXPECT_TRUE(has("\"name\": \"hasten::backward\"", "\"name\":\"hasten::backward\"")) << "no backward range in " << traces[0];
  EXPECT_TRUE(has("\"name\": \"hasten::optimizer_step\"", "\"name\":\"hasten::optimizer_step\"")) << "no optimizer_step range";
}

// Big-model inference over GPUs (load_checkpoint_and_dispatch): a map puts the input layer and
// block0 on cuda:0, block1 on the CPU (offloaded: it runs on cuda:0 with its weights copied in),
// block2 on disk (read to cuda:0 for its forward), block3 on the last GPU; the head, a unit under
// the root, runs on cuda:0. Each unit moves its input to its device, the forward equals the whole
// model's on the CPU, and the offloaded units hold no GPU weights between forwards.
struct DispatchStackImpl : torch::nn::Module {
  DispatchStackImpl() {
    in = register_module("in", torch::nn::Linear(8, 64));
    for (int i = 0; i < 4; ++i)
      blocks.push_back(register_module("block" + std::to_string(i), hasten::Unit<torch::nn::Linear>(64, 64)));
    head = register_module("head", hasten::Unit<torch::nn::Linear>(64, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = in(x);
    for (auto& b : blocks) h = torch::relu(b->forward(h));
    return head->forward(h);
  }
  torch::nn::Linear in{nullptr};
  std::vector<hasten::Unit<torch::nn::Linear>> blocks;
  hasten::Unit<torch::nn::Linear> head{nullptr};
};
TORCH_MODULE(DispatchStack);

TEST(GpuBigModeling, UnitsRunOnTheirGpusOffloadedAndDiskUnitsOnTheFirst) {
  REQUIRE_GPUS(1);
  strict_float32();
  TempDir dir;
  const std::string file = (dir.path() / "model.safetensors").string();
  torch::manual_seed(0);
  DispatchStack whole;
  hasten::NamedTensors tensors;
  for (auto& p : whole->named_parameters()) tensors.emplace_back(p.key(), p.value().detach());
  hasten::save_safetensors(file, tensors);

  const std::string last = "cuda:" + std::to_string(visible_gpus() - 1);
  DispatchStack big{nullptr};
  {
    hasten::EmptyWeights empty;
    big = DispatchStack();
  }
  hasten::load_checkpoint_and_dispatch(
      *big, file, {{"", "cuda:0"}, {"block0", "cuda:0"}, {"block1", "cpu"}, {"block2", "disk"}, {"block3", last}});
  const torch::Device gpu0(torch::kCUDA, 0);
  EXPECT_EQ(big->in->weight.device(), gpu0);
  EXPECT_EQ(big->blocks[0]->weight.device(), gpu0);
  EXPECT_EQ(big->blocks[3]->weight.device(), torch::Device(last));
  EXPECT_EQ(big->head->weight.device(), gpu0) << "a unit under the root goes where the root goes";
  EXPECT_EQ(big->blocks[1]->weight.numel(), 0) << "an offloaded unit holds no weights between forwards";
  EXPECT_EQ(big->blocks[2]->weight.numel(), 0) << "a disk unit holds no weights between forwards";

  torch::manual_seed(1);
  const torch::Tensor x = torch::randn({5, 8});
  torch::NoGradGuard no_grad;
  const torch::Tensor want = whole->forward(x);
  const torch::Tensor got = big->forward(x.to(gpu0));  // `in` is no unit: its input is the caller's to place
  EXPECT_EQ(got.device(), gpu0) << "the head runs on cuda:0";
  EXPECT_TRUE(torch::allclose(got.cpu(), want, 1e-5, 1e-6)) << (got.cpu() - want).abs().max();
  EXPECT_EQ(big->blocks[1]->weight.numel(), 0) << "the offloaded unit kept its weights on the GPU";
  EXPECT_EQ(big->blocks[2]->weight.numel(), 0) << "the disk unit kept its weights";
  EXPECT_EQ(big->blocks[1]->weight.device(), gpu0);
  // A unit called alone with a CPU input moves it to its GPU.
  const torch::Tensor h = torch::randn({2, 64});
  EXPECT_TRUE(torch::allclose(big->blocks[3]->forward(h).cpu(), whole->blocks[3]->forward(h), 1e-5, 1e-6));
  EXPECT_EQ(big->blocks[3]->forward(h).device(), torch::Device(last));
  // A map naming a GPU this machine lacks is one line; a dispatched model is not prepared.
  DispatchStack other;
  const std::string e = hasten::test::error_of(
      [&] { hasten::load_checkpoint_and_dispatch(*other, file, {{"", "cuda:" + std::to_string(visible_gpus())}}); });
  EXPECT_NE(e.find("this machine has " + std::to_string(visible_gpus())), std::string::npos) << e;
  if (visible_gpus() > 1) {  // a module inside a unit runs where the unit runs
    struct NestedImpl : torch::nn::Module {
      NestedImpl() { u = register_module("u", hasten::Unit<torch::nn::Sequential>(torch::nn::Linear(4, 4), torch::nn::Linear(4, 4))); }
      hasten::Unit<torch::nn::Sequential> u{nullptr};
    };
    auto nested = std::make_shared<NestedImpl>();
    hasten::NamedTensors weights;
    for (auto& p : nested->named_parameters()) weights.emplace_back(p.key(), p.value().detach());
    const std::string nested_file = (dir.path() / "nested.safetensors").string();
    hasten::save_safetensors(nested_file, weights);
    const std::string inside = hasten::test::error_of(
        [&] { hasten::load_checkpoint_and_dispatch(*nested, nested_file, {{"", "cuda:0"}, {"u.1", "cuda:1"}}); });
    EXPECT_NE(inside.find("'u.1' is mapped to cuda:1 inside the unit 'u', which runs on cuda:0"), std::string::npos) << inside;
  }
  hasten::Accelerator acc(isolated());
  const std::string prepared = hasten::test::error_of([&] { auto pm = acc.prepare(big); });
  EXPECT_NE(prepared.find("dispatched by a device map"), std::string::npos) << prepared;
}

TEST(GpuLaunch, AProcessThatInitialisedCudaCannotFork) {
  REQUIRE_GPUS(1);
  (void)torch::cuda::device_count();  // cuInit in this process
  ASSERT_TRUE(torch::cuda::is_available());
  try {
    hasten::launch([] {}, with_ranks(2));
    FAIL() << "hasten::launch after CUDA initialised must be refused";
  } catch (const hasten::Error& e) {
    EXPECT_NE(std::string(e.what()).find("already initialised CUDA"), std::string::npos) << e.what();
  }
}

}  // namespace
