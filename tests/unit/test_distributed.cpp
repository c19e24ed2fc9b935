// Multi-process behaviour through the public API, in worker processes started by
// hasten::launch: the gloo comm plugin's operations and dtypes against references computed
// locally, gather_for_metrics, the debug mode, and failures that must surface as errors.
#include <hasten/hasten.hpp>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <csignal>
#include <tuple>
#include <unistd.h>
#include <cstdlib>
#include <fstream>

#include "test_util.hpp"

using hasten::Accelerator;
using hasten::ReduceOp;

namespace {

// Fails the worker (and so the launch) with a message when a condition does not hold.
void require(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

hasten::LaunchOptions with_ranks(int n, std::map<std::string, std::string> env = {}) {
  static hasten::test::TempDir home;
  hasten::LaunchOptions o;
  o.num_processes = n;
  o.timeout_s = 120;
  o.env = std::move(env);
  o.env["HASTEN_HOME"] = home.path().string();
  o.env["HASTEN_TIMEOUT_S"] = o.env.count("HASTEN_TIMEOUT_S") ? o.env["HASTEN_TIMEOUT_S"] : "60";
  return o;
}

// Rank r's contribution: small integers, exact in every dtype.
torch::Tensor contribution(int rank, int64_t n, torch::ScalarType dtype) {
  return (torch::arange(n, torch::kLong) % 7 * (rank + 1) - rank * 3).to(dtype);
}

void all_operations_and_dtypes() {
  Accelerator acc;
  const int w = acc.num_processes(), r = acc.process_index();
  const std::string expected = std::getenv("HASTEN_COMM");
  require(acc.comm_backend() == expected, "the CPU backend is " + acc.comm_backend() + ", expected " + expected);
  const std::vector<torch::ScalarType> dtypes = {torch::kFloat, torch::kDouble, torch::kBFloat16, torch::kHalf, torch::kLong};
  const std::vector<std::pair<ReduceOp, const char*>> ops = {
      {ReduceOp::Sum, "sum"}, {ReduceOp::Avg, "avg"}, {ReduceOp::Min, "min"}, {ReduceOp::Max, "max"}};
  const int64_t n = 1000;
  for (auto dtype : dtypes) {
    std::vector<torch::Tensor> all;
    for (int k = 0; k < w; ++k) all.push_back(contribution(k, n, dtype).to(torch::kDouble));
    auto stacked = torch::stack(all);
    for (auto [op, name] : ops) {
      torch::Tensor expected;
      if (op == ReduceOp::Sum) expected = stacked.sum(0);
      if (op == ReduceOp::Avg) expected = stacked.sum(0) / w;
      if (op == ReduceOp::Min) expected = std::get<0>(stacked.min(0));
      if (op == ReduceOp::Max) expected = std::get<0>(stacked.max(0));
      if (dtype == torch::kLong && op == ReduceOp::Avg) expected = stacked.sum(0).to(torch::kLong).div(w, "trunc");
      auto t = contribution(r, n, dtype);
      acc.all_reduce_(t, op).wait();
      const auto got = t.to(torch::kDouble);
      const auto want = expected.to(dtype).to(torch::kDouble);
      require(torch::equal(got, want), std::string("allreduce ") + name + " " + c10::toString(dtype) +
                                           " differs from the reference by " +
                                           std::to_string((got - want).abs().max().item<double>()));
    }
    // allgather: rank-major concatenation.
    auto gathered = acc.gather(contribution(r, 10, dtype));
    std::vector<torch::Tensor> parts;
    for (int k = 0; k < w; ++k) parts.push_back(contribution(k, 10, dtype));
    require(torch::equal(gathered, torch::cat(parts)), std::string("allgather ") + c10::toString(dtype));
    // reduce_scatter: slice r of the sum of everyone's input.
    auto rs = acc.reduce_scatter(contribution(r, 12 * w, dtype), ReduceOp::Sum);
    torch::Tensor sum = torch::zeros({12 * w}, torch::kDouble);
    for (int k = 0; k < w; ++k) sum += contribution(k, 12 * w, dtype).to(torch::kDouble);
    require(torch::equal(rs.to(torch::kDouble), sum.narrow(0, 12 * r, 12).to(dtype).to(torch::kDouble)),
            std::string("reduce_scatter ") + c10::toString(dtype));
    // broadcast from the last rank.
    auto b = contribution(r, 33, dtype);
    acc.broadcast_(b, w - 1);
    require(torch::equal(b, contribution(w - 1, 33, dtype)), std::string("broadcast ") + c10::toString(dtype));
  }
  // Several asynchronous operations in flight, then waited for.
  std::vector<torch::Tensor> ts;
  std::vector<hasten::Work> works;
  for (int i = 0; i < 8; ++i) ts.push_back(torch::full({1 << 12}, static_cast<float>(i + r)));
  for (auto& t : ts) works.push_back(acc.all_reduce_(t, ReduceOp::Sum));
  for (auto& wk : works) wk.wait();
  for (int i = 0; i < 8; ++i)
    require(ts[static_cast<size_t>(i)].eq(static_cast<float>(w * i + w * (w - 1) / 2)).all().item<bool>(), "async allreduce");
  acc.wait_for_everyone();
  // Utilities on top.
  require(acc.reduce(torch::tensor({1.0 * r}), "max").item<double>() == w - 1, "reduce max");
  require(acc.broadcast(std::string(r == 0 ? "from rank 0" : "other")) == "from rank 0", "broadcast string");
  auto padded = acc.pad_across_processes(torch::ones({r + 1, 2}), 0, -1.0);
  require(padded.size(0) == w && padded[0][0].item<double>() == 1.0, "pad_across_processes");
  if (r == w - 1) acc.set_trigger();
  require(acc.check_trigger(), "check_trigger sees the last rank's trigger");
  require(!acc.check_trigger(), "check_trigger resets");
  const auto share = acc.split_between_processes(std::vector<int>{1, 2, 3, 4, 5});
  require(!share.empty(), "split_between_processes");
}

}  // namespace

TEST(Gloo, EveryOperationAndDtypeWithTwoRanks) {
  hasten::launch(all_operations_and_dtypes, with_ranks(2, {{"HASTEN_COMM", "gloo"}}));
}

TEST(Gloo, EveryOperationAndDtypeWithThreeRanks) {
  hasten::launch(all_operations_and_dtypes, with_ranks(3, {{"HASTEN_COMM", "gloo"}}));
}

TEST(Shm, EveryOperationAndDtypeWithTwoRanks) {
  hasten::launch(all_operations_and_dtypes, with_ranks(2, {{"HASTEN_COMM", "shm"}}));
}

TEST(Shm, EveryOperationAndDtypeWithThreeRanks) {
  hasten::launch(all_operations_and_dtypes, with_ranks(3, {{"HASTEN_COMM", "shm"}}));
}

TEST(Shm, IsTheDefaultOnOneMachineAndChunksLargeBuffers) {
  // 1 MiB buffers: a 3 MB tensor goes through in several chunks.
  hasten::launch(
      [] {
        Accelerator acc;
        require(acc.comm_backend() == "shm", "auto picked " + acc.comm_backend());
        const int w = acc.num_processes(), r = acc.process_index();
        auto t = torch::full({750001}, static_cast<float>(r + 1));
        acc.all_reduce_(t, ReduceOp::Avg).wait();
        require(t.eq((w + 1) / 2.0f).all().item<bool>(), "chunked allreduce");
        auto g = acc.gather(torch::full({300000}, static_cast<float>(r)));
        require(g.narrow(0, 300000, 300000).eq(1.0f).all().item<bool>(), "chunked allgather");
        auto rs = acc.reduce_scatter(torch::ones({2 * 400000}), ReduceOp::Sum);
        require(rs.eq(2.0f).all().item<bool>() && rs.numel() == 400000, "chunked reduce_scatter");
        auto b = torch::full({500000}, static_cast<float>(r));
        acc.broadcast_(b, 1);
        require(b.eq(1.0f).all().item<bool>(), "chunked broadcast");
      },
      with_ranks(2, {{"HASTEN_COMM_OPTIONS", "{buffer_mb: 1}"}}));
}

TEST(CommOptions, AnUnknownKeyOrABadValueIsAnErrorNamingIt) {
  // Before: the options were searched as text, so a misspelt key next to a known one passed.
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"shm", "{buffer_mb: 1, bufer_mb: 2}", "shm options: unknown key 'bufer_mb' (allowed: buffer_mb); did you mean 'buffer_mb'?"},
      {"shm", "{buffer_mb: lots}", "option buffer_mb: expected a number, got \"lots\""},
      // Per device type (the shape of `comm`): the cpu entry is the CPU backend's.
      {"shm", "{cpu: {bufer_mb: 2}, cuda: {}}", "shm options: unknown key 'bufer_mb' (allowed: buffer_mb)"},
      {"shm", "{buffer_mb: 0.5}", "buffer_mb must be 1 to 4096"},
      {"gloo", "{hostname: localhost, interface: eth0}", "gloo options: unknown key 'interface' (allowed: hostname)"},
      {"gloo", "{hostname: 3}", "option hostname: expected a string, got 3"}};
  for (const auto& [comm, options, expected] : cases) {
    const std::string want = expected;
    hasten::launch(
        [want] {
          try {
            Accelerator acc;
            require(false, "the options were accepted");
          } catch (const hasten::PluginError& e) {
            require(std::string(e.what()).find(want) != std::string::npos, std::string("message: ") + e.what());
          }
        },
        with_ranks(2, {{"HASTEN_COMM", comm}, {"HASTEN_COMM_OPTIONS", options}}));
  }
}

TEST(Distributed, GatherForMetricsIsExact) {
  // 9 samples, batch 5, 2 ranks: rank 1's batch is padded with one repeated sample.
  hasten::launch(
      [] {
        Accelerator acc;
        auto x = torch::arange(9, torch::kFloat).unsqueeze(1);
        hasten::DataLoader data(hasten::TensorDataset(x, torch::arange(9)), {.batch_size = 5});
        auto loader = acc.prepare(data);
        std::vector<torch::Tensor> seen;
        for (auto& batch : loader) seen.push_back(acc.gather_for_metrics(batch.target));
        require(seen.size() == 1, "one round of batches");
        require(torch::equal(seen[0], torch::arange(9)), "gather_for_metrics returned " + c10::str(seen[0]));
        // gather (without the metric dedup) keeps the padding.
      },
      with_ranks(2));
}

TEST(Distributed, LoadersShardOneGlobalOrderAndEveryRankAgreesOnTheEnd) {
  hasten::launch(
      [] {
        Accelerator acc;
        hasten::DataLoader data(hasten::TensorDataset(torch::arange(20).unsqueeze(1), torch::arange(20)),
                                {.batch_size = 3, .shuffle = true, .seed = 5});
        auto loader = acc.prepare(data);
        for (int epoch = 0; epoch < 2; ++epoch) {
          std::vector<torch::Tensor> mine;
          for (auto& batch : loader) mine.push_back(acc.gather_for_metrics(batch.target));
          auto all = torch::cat(mine);
          require(all.numel() == 20, "an epoch covers the dataset once, got " + std::to_string(all.numel()));
          require(std::get<0>(all.sort()).equal(torch::arange(20)), "every sample exactly once");
        }
      },
      with_ranks(2));
}

TEST(Distributed, DebugModeNamesTheRanksThatDisagree) {
  hasten::test::TempDir dir;
  const std::string marker = (dir.path() / "debug.txt").string();
  try {
    hasten::launch(
        [marker] {
          Accelerator acc;
          auto t = torch::ones({acc.process_index() + 2, 3});
          try {
            acc.gather(t);  // different shapes: without debug mode, a hang or garbage
          } catch (const hasten::UsageError& e) {
            if (acc.is_main_process()) std::ofstream(marker) << e.what();
            throw;
          }
        },
        with_ranks(2, {{"HASTEN_DEBUG", "1"}}));
    FAIL() << "mismatched collectives must fail";
  } catch (const hasten::Error& e) {
    EXPECT_NE(std::string(e.what()).find("exited with status 1"), std::string::npos) << e.what();
  }
  std::ifstream in(marker);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(text.find("ranks disagree on collective #0"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 0: gather Float[2, 3]; rank 1: gather Float[3, 3]"), std::string::npos) << text;
}

TEST(Distributed, ADeadPeerIsAnErrorOnTheOthersNotAHang) {
  // Rank 1 exits after its first collective; rank 0's next collective fails with a message.
  hasten::test::TempDir dir;
  const std::string marker = (dir.path() / "rank0.txt").string();
  try {
    hasten::launch(
        [marker] {
          Accelerator acc;
          auto t = torch::ones({4});
          acc.all_reduce_(t).wait();
          if (acc.process_index() == 1) std::_Exit(7);
          std::signal(SIGTERM, SIG_IGN);  // outlive the launcher's SIGTERM long enough to report
          try {
            for (int i = 0; i < 3; ++i) acc.all_reduce_(t).wait();
          } catch (const hasten::Error& e) {
            std::ofstream(marker) << e.what();
            throw;
          }
        },
        [] {
          auto o = with_ranks(2, {{"HASTEN_TIMEOUT_S", "20"}, {"HASTEN_COMM", "gloo"}});
          o.grace_s = 15;
          return o;
        }());
    FAIL();
  } catch (const hasten::Error& e) {
    // The launcher names the first rank that failed; rank 0 reported its own error.
    const std::string what = e.what();
    EXPECT_TRUE(what.find("rank 1") != std::string::npos || what.find("rank 0") != std::string::npos) << what;
  }
  std::ifstream in(marker);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(text.find("gloo"), std::string::npos) << "rank 0 did not get an error from its collective: " << text;
}

TEST(Shm, ADeadPeerIsAnErrorNotAHang) {
  hasten::test::TempDir dir;
  const std::string marker = (dir.path() / "rank0.txt").string();
  try {
    auto o = with_ranks(2, {{"HASTEN_TIMEOUT_S", "20"}, {"HASTEN_COMM", "shm"}});
    o.grace_s = 15;
    hasten::launch(
        [marker] {
          Accelerator acc;
          auto t = torch::ones({4});
          acc.all_reduce_(t).wait();
          if (acc.process_index() == 1) std::_Exit(7);
          std::signal(SIGTERM, SIG_IGN);
          try {
            acc.all_reduce_(t).wait();
          } catch (const hasten::Error& e) {
            std::ofstream(marker) << e.what();
            throw;
          }
        },
        o);
    FAIL();
  } catch (const hasten::Error&) {
  }
  std::ifstream in(marker);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(text.find("shm: rank 1"), std::string::npos) << text;
  EXPECT_NE(text.find("died during allreduce"), std::string::npos) << text;
}

// The plain-C example comm plugin (sdk/examples/c-plugins), built against the installed SDK
// alone by tests/abi/c_plugins.sh, which runs these tests with HASTEN_TEST_C_PLUGIN_DIR set to
// where it built it (abi.c_plugins); skipped otherwise. 1 KiB buffers: everything goes in chunks.
static const char* c_plugin_dir() { return std::getenv("HASTEN_TEST_C_PLUGIN_DIR"); }

TEST(CExampleComm, EveryOperationAndDtypeWithThreeRanks) {
  if (c_plugin_dir() == nullptr) GTEST_SKIP() << "run by tests/abi/c_plugins.sh (ctest abi.c_plugins)";
  hasten::launch(all_operations_and_dtypes,
                 with_ranks(3, {{"HASTEN_COMM", "c_shm"}, {"HASTEN_PLUGIN_PATH", c_plugin_dir()},
                                {"HASTEN_COMM_OPTIONS", "{buffer_mb: 0.001}"}}));
}

TEST(CExampleComm, ADeadPeerIsAnErrorNotAHang) {
  if (c_plugin_dir() == nullptr) GTEST_SKIP() << "run by tests/abi/c_plugins.sh (ctest abi.c_plugins)";
  hasten::test::TempDir dir;
  const std::string marker = (dir.path() / "rank0.txt").string();
  try {
    auto o = with_ranks(2, {{"HASTEN_TIMEOUT_S", "20"}, {"HASTEN_COMM", "c_shm"}, {"HASTEN_PLUGIN_PATH", c_plugin_dir()}});
    o.grace_s = 15;
    hasten::launch(
        [marker] {
          Accelerator acc;
          auto t = torch::ones({4});
          acc.all_reduce_(t).wait();
          if (acc.process_index() == 1) std::_Exit(7);
          std::signal(SIGTERM, SIG_IGN);
          try {
            acc.all_reduce_(t).wait();
          } catch (const hasten::Error& e) {
            std::ofstream(marker) << e.what();
            throw;
          }
        },
        o);
    FAIL();
  } catch (const hasten::Error&) {
  }
  std::ifstream in(marker);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(text.find("c_shm: rank 1 died during allreduce"), std::string::npos) << text;
}

TEST(Distributed, InProcessLauncherReportsAFailingRank) {
  try {
    hasten::launch(
        [] {
          if (std::getenv("RANK") == std::string("1")) throw std::runtime_error("on purpose");
        },
        with_ranks(2));
    FAIL();
  } catch (const hasten::Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("exited with status 1"), std::string::npos) << e.what();
  }
}

// The deadline of the whole launch is reported as such, not as the SIGTERM that ended the
// workers it stopped (both launchers share the stop policy: worker_supervisor.cpp).
TEST(Distributed, InProcessLauncherReportsItsDeadline) {
  auto options = with_ranks(2);
  options.timeout_s = 0.5;
  options.grace_s = 0.2;
  try {
    hasten::launch([] { ::sleep(30); }, options);
    FAIL();
  } catch (const hasten::Error& e) {
    EXPECT_NE(std::string(e.what()).find("did not finish within"), std::string::npos) << e.what();
  }
}
