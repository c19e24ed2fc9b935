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

#include "collective_checks.hpp"
#include "test_util.hpp"

using hasten::Accelerator;
using hasten::ReduceOp;

namespace {

// Fails the worker (and so the launch) with a message when a condition does not hold.
using hasten::test::require;
using hasten::test::with_ranks;
using hasten::test::all_operations_and_dtypes;
using hasten::test::contribution;

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

// Collectives of several chunks whose sizes are not multiples of the chunk (1 MiB slots), in
// every dtype the reductions support, interleaved so that consecutive operations reuse the
// two staging slots while peers may still be reading the previous chunk; the *_into forms
// into caller-owned outputs (one of them an allgather in place, input inside the output).
void chunked_every_dtype() {
  Accelerator acc;
  const int w = acc.num_processes(), r = acc.process_index();
  const std::vector<torch::ScalarType> dtypes = {torch::kFloat, torch::kDouble, torch::kBFloat16, torch::kHalf, torch::kLong,
                                                torch::kInt};
  auto name = [](const char* what, torch::ScalarType d) { return std::string(what) + " " + c10::toString(d); };
  for (auto dtype : dtypes) {
    const int64_t es = static_cast<int64_t>(c10::elementSize(dtype));
    const int64_t chunk = (int64_t{1} << 20) / es;  // elements of one slot
    // allgather: 2 chunks and a remainder per rank, then 1 element, then a few.
    for (int64_t k : {2 * chunk + 99, int64_t{1}, chunk / 3 + 7}) {
      auto g = acc.gather(contribution(r, k, dtype));
      std::vector<torch::Tensor> parts;
      for (int q = 0; q < w; ++q) parts.push_back(contribution(q, k, dtype));
      const auto want = torch::cat(parts);
      require(torch::equal(g, want), name("chunked gather", dtype) + " of " + std::to_string(k));
      auto out = torch::full({k * w}, -1, dtype);
      acc.all_gather_into(out, contribution(r, k, dtype));
      require(torch::equal(out, want), name("all_gather_into", dtype) + " of " + std::to_string(k));
      auto in_place = torch::full({k * w}, -1, dtype);
      in_place.narrow(0, r * k, k).copy_(contribution(r, k, dtype));
      acc.all_gather_into(in_place, in_place.narrow(0, r * k, k));
      require(torch::equal(in_place, want), name("all_gather_into in place", dtype) + " of " + std::to_string(k));
    }
    // reduce_scatter: each rank's slice is more than one staging chunk plus a remainder.
    std::vector<std::pair<ReduceOp, const char*>> reductions = {{ReduceOp::Sum, "sum"}, {ReduceOp::Avg, "avg"}};
    if (dtype == torch::kFloat) reductions.push_back({ReduceOp::Max, "max"});  // the kernels' other ops: see above
    for (auto [op, opname] : reductions) {
      const int64_t m = chunk + 1237;
      std::vector<torch::Tensor> all;
      for (int q = 0; q < w; ++q) all.push_back(contribution(q, m * w, dtype).to(torch::kDouble));
      auto stacked = torch::stack(all);
      torch::Tensor full = op == ReduceOp::Max ? std::get<0>(stacked.max(0)) : stacked.sum(0);
      if (op == ReduceOp::Avg)
        full = (dtype == torch::kLong || dtype == torch::kInt) ? full.to(torch::kLong).div(w, "trunc") : full / w;
      const auto want = full.narrow(0, r * m, m).to(dtype);
      auto got = acc.reduce_scatter(contribution(r, m * w, dtype), op);
      require(torch::equal(got, want), name("chunked reduce_scatter", dtype) + " " + opname);
      auto into = torch::full({m}, -1, dtype);
      acc.reduce_scatter_into(into, contribution(r, m * w, dtype), op);
      require(torch::equal(into, want), name("reduce_scatter_into", dtype) + " " + opname);
    }
    // allreduce and broadcast of 2.5 chunks between them; each rank's slice of a chunk spans
    // several of the 64 KiB blocks it reduces in, and a remainder.
    for (auto [op, opname] : reductions) {
      auto t = contribution(r, 2 * chunk + chunk / 2, dtype);
      acc.all_reduce_(t, op).wait();
      std::vector<torch::Tensor> all;
      for (int q = 0; q < w; ++q) all.push_back(contribution(q, t.numel(), dtype).to(torch::kDouble));
      auto stacked = torch::stack(all);
      torch::Tensor want = op == ReduceOp::Max ? std::get<0>(stacked.max(0)) : stacked.sum(0);
      if (op == ReduceOp::Avg)
        want = (dtype == torch::kLong || dtype == torch::kInt) ? want.to(torch::kLong).div(w, "trunc") : want / w;
      require(torch::equal(t, want.to(dtype)), name("chunked allreduce", dtype) + " " + opname);
    }
    auto b = contribution(r, 2 * chunk + 5, dtype);
    acc.broadcast_(b, w - 1);
    require(torch::equal(b, contribution(w - 1, b.numel(), dtype)), name("chunked broadcast", dtype));
    acc.wait_for_everyone();
  }
}

TEST(Shm, EveryOperationAndDtypeWithFourRanks) {
  hasten::launch(all_operations_and_dtypes, with_ranks(4, {{"HASTEN_COMM", "shm"}}));
}

TEST(Shm, ChunkedCollectivesInEveryDtypeWithTwoRanks) {
  hasten::launch(chunked_every_dtype, with_ranks(2, {{"HASTEN_COMM", "shm"}, {"HASTEN_COMM_OPTIONS", "{buffer_mb: 1}"}}));
}

TEST(Shm, ChunkedCollectivesInEveryDtypeWithThreeRanks) {
  hasten::launch(chunked_every_dtype, with_ranks(3, {{"HASTEN_COMM", "shm"}, {"HASTEN_COMM_OPTIONS", "{buffer_mb: 1}"}}));
}

TEST(Shm, ChunkedCollectivesInEveryDtypeWithFourRanks) {
  hasten::launch(chunked_every_dtype, with_ranks(4, {{"HASTEN_COMM", "shm"}, {"HASTEN_COMM_OPTIONS", "{buffer_mb: 1}"}}));
}

TEST(Collectives, IntoFormsRefuseMismatchedTensorsWithOneLine) {
  hasten::launch(
      [] {
        Accelerator acc;
        auto expect = [](auto&& f, const std::string& want) {
          try {
            f();
            require(false, "accepted: " + want);
          } catch (const hasten::UsageError& e) {
            require(std::string(e.what()).find(want) != std::string::npos, std::string("message: ") + e.what());
          }
        };
        auto out = torch::zeros({5});
        expect([&] { acc.all_gather_into(out, torch::ones({3})); },
               "all_gather_into: output has 5 elements; it must hold 2 x 3 (the processes x input)");
        expect([&] { acc.reduce_scatter_into(out, torch::ones({6})); },
               "reduce_scatter_into: input has 6 elements; it must hold 2 x 5 (the processes x output)");
        auto doubles = torch::zeros({6}, torch::kDouble);
        expect([&] { acc.all_gather_into(doubles, torch::ones({3})); }, "must have one dtype and device");
        auto strided = torch::zeros({4, 2}).t();
        expect([&] { acc.all_gather_into(strided, torch::ones({4})); }, "must be contiguous");
        // Nothing was sent: the next collective still pairs up.
        auto g = torch::zeros({4});
        acc.all_gather_into(g, torch::full({2}, static_cast<float>(acc.process_index())));
        require(torch::equal(g, torch::tensor({0.f, 0.f, 1.f, 1.f})), "all_gather_into after the refusals");
      },
      with_ranks(2));
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
            // Each rank its own file: the first rank to fail makes the launcher stop the
            // other, which may not get to write (which one comes first is a race).
            std::ofstream(marker + "." + std::to_string(acc.process_index())) << e.what();
            throw;
          }
        },
        with_ranks(2, {{"HASTEN_DEBUG", "1"}}));
    FAIL() << "mismatched collectives must fail";
  } catch (const hasten::Error& e) {
    EXPECT_NE(std::string(e.what()).find("exited with status 1"), std::string::npos) << e.what();
  }
  int written = 0;
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream in(marker + "." + std::to_string(rank));
    if (!in) continue;
    ++written;
    std::string text((std::istreambuf_iterator<char>(in)), {});
    EXPECT_NE(text.find("ranks disagree on collective #0"), std::string::npos) << "rank " << rank << ": " << text;
    EXPECT_NE(text.find("rank 0: gather Float[2, 3]; rank 1: gather Float[3, 3]"), std::string::npos)
        << "rank " << rank << ": " << text;
  }
  EXPECT_GE(written, 1) << "no rank named the disagreement";
}

TEST(Distributed, ADeadPeerIsAnErrorOnTheOthersNotAHang) {
  // Rank 1 exits after its first collective; rank 0's next collective fails with a message.
  hasten::test::TempDir dir;
  const std::string marker = (dir.path() / "rank0.txt").string();
  try {
    hasten::launch(
        [marker] {
          Accelerator acc;
          // Outlive the launcher's SIGTERM long enough to report. Set before the first
          // collective: rank 1 exits as soon as that one completes, and the launcher's SIGTERM
          // must not find rank 0 between it and here (it did once, under load).
          std::signal(SIGTERM, SIG_IGN);
          auto t = torch::ones({4});
          acc.all_reduce_(t).wait();
          if (acc.process_index() == 1) std::_Exit(7);
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
          // Outlive the launcher's SIGTERM long enough to report. Set before the first
          // collective: rank 1 exits as soon as that one completes, and the launcher's SIGTERM
          // must not find rank 0 between it and here (it did once, under load).
          std::signal(SIGTERM, SIG_IGN);
          auto t = torch::ones({4});
          acc.all_reduce_(t).wait();
          if (acc.process_index() == 1) std::_Exit(7);
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
          // Outlive the launcher's SIGTERM long enough to report. Set before the first
          // collective: rank 1 exits as soon as that one completes, and the launcher's SIGTERM
          // must not find rank 0 between it and here (it did once, under load).
          std::signal(SIGTERM, SIG_IGN);
          auto t = torch::ones({4});
          acc.all_reduce_(t).wait();
          if (acc.process_index() == 1) std::_Exit(7);
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
