// Accelerators made and destroyed in any order on 2 ranks (the rendezvous races), debug mode
// (its run-time switch, pad_across_processes' shape check, a peer that left), and the
// per-loader even_batches / split_batches, through the public API.
#include <hasten/hasten.hpp>
#include <hasten/registry.hpp>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <thread>

#include "test_util.hpp"

// A namespace per file: the files of this executable compile as one unit.
namespace lifecycle_tests {

using hasten::Accelerator;

namespace {

using hasten::test::require;

hasten::LaunchOptions two_ranks(std::map<std::string, std::string> env = {}, double timeout_s = 60) {
  return hasten::test::with_ranks(2, std::move(env), timeout_s);
}

std::string read(const std::string& file) { return hasten::test::TempDir::read_file(file); }

// Runs fn on 2 ranks, expecting every rank to throw hasten::UsageError; each rank writes its
// message to dir/rank<r>.txt and ends normally (a rank that failed would have the launcher stop
// the other before it wrote its own). Returns the two messages.
std::vector<std::string> usage_errors(const std::function<void(Accelerator&)>& fn,
                                      std::map<std::string, std::string> env = {}) {
  hasten::test::TempDir dir;
  const std::string base = dir.path().string();
  hasten::launch(
      [fn, base] {
        Accelerator acc;
        try {
          fn(acc);
        } catch (const hasten::UsageError& e) {
          std::ofstream(base + "/rank" + std::to_string(acc.process_index()) + ".txt") << e.what();
          return;
        }
        throw std::runtime_error("no hasten::UsageError on rank " + std::to_string(acc.process_index()));
      },
      two_ranks(std::move(env)));
  return {read(base + "/rank0.txt"), read(base + "/rank1.txt")};
}

}  // namespace

// ---- rendezvous races -----------------------------------------------------------------------

// One rank makes its Accelerator and leaves at once (no collective), while the other may still
// be setting up its comm backend through rank 0's store. 50 times: 10 launches of 5 rounds;
// in each round one rank destroys its Accelerator at once and, in the last, returns (its
// process exits: rank 0's takes the store with it). Which rank is late, and by how much, varies
// from one round to the next.
TEST(Lifecycle, ARankThatLeavesRightAfterConstructionNeverBreaksTheOthers) {
  // The plugins are found and loaded once, here, and the forked workers inherit them: the
  // launches then cost what the rendezvous and the comm set-up cost, the part under test.
  hasten::PluginRegistry::instance().discover();
  for (int launch = 0; launch < 10; ++launch) {
    hasten::launch(
        [launch] {
          const int rank = std::stoi(std::getenv("RANK"));
          for (int round = 0; round < 5; ++round) {
            const int i = launch * 5 + round, late = i % 2, delay_us = (i / 2) % 5 * 400;
            if (rank == late) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
            Accelerator acc;
            require(acc.num_processes() == 2, "two ranks");
          }
        },
        two_ranks());
  }
}

// Several Accelerators in one process: two alive at once (they used to collide on the store's
// port), one made after another was destroyed, and the ranks destroying and making them in
// different interleavings. Each one's collectives give the right answers.
TEST(Lifecycle, AcceleratorsAfterTheFirstAndAliveTogetherWork) {
  hasten::launch(
      [] {
        const int rank = std::stoi(std::getenv("RANK"));
        auto sum_is_right = [&](Accelerator& acc, double scale) {
          auto t = acc.reduce(torch::full({3}, (rank + 1) * scale), "sum");
          require(torch::equal(t, torch::full({3}, 3 * scale)), "a reduce gave " + c10::str(t));
        };
        for (int round = 0; round < 5; ++round) {
          auto first = std::make_unique<Accelerator>();
          sum_is_right(*first, 1);
          std::unique_ptr<Accelerator> second;
          if (rank == round % 2) {  // this rank destroys the first before making the second
            first.reset();
            second = std::make_unique<Accelerator>();
          } else {  // this one makes the second while the first is alive
            second = std::make_unique<Accelerator>();
          }
          sum_is_right(*second, 2);
          if (first) {
            first.reset();
          }
          Accelerator a, b;  // two alive, used in turn
          sum_is_right(b, 3);
          sum_is_right(a, 4);
          sum_is_right(b, 5);
        }
      },
      two_ranks());
}

// ---- debug mode ---------------------------------------------------------------------------

TEST(Lifecycle, PadAcrossProcessesRefusesTensorsThatDifferInDimensionsOnEveryRank) {
  for (const char* debug : {"1", "0"}) {
    auto errors = usage_errors(
        [](Accelerator& acc) {
          auto t = acc.process_index() == 0 ? torch::ones({2, 3}) : torch::ones({2, 3, 1});
          acc.pad_across_processes(t, 0);
        },
        {{"HASTEN_DEBUG", debug}});
    for (auto& e : errors) {
      EXPECT_NE(e.find("pad_across_processes: the ranks' tensors differ in number of dimensions (rank 0: 2, rank 1: 3)"),
                std::string::npos)
          << "debug " << debug << ": " << e;
    }
  }
  // A 0-d tensor on one rank and a 1-d one on the other is the same mistake.
  auto errors = usage_errors([](Accelerator& acc) {
    acc.pad_across_processes(acc.process_index() == 0 ? torch::tensor(1.0f) : torch::ones({4}), 0);
  });
  for (auto& e : errors) EXPECT_NE(e.find("(rank 0: 0, rank 1: 1)"), std::string::npos) << e;
}

TEST(Lifecycle, PadAcrossProcessesStillPadsAlongDim) {
  hasten::launch(
      [] {
        Accelerator acc;
        const int64_t n = acc.process_index() + 2;
        auto t = acc.pad_across_processes(torch::ones({2, n}), 1, -1);
        require(t.sizes() == torch::IntArrayRef({2, 3}), "padded to the largest size: " + c10::str(t.sizes()));
        require(t.index({0, 2}).item<double>() == (n == 3 ? 1.0 : -1.0), "padding value");
        // A dim out of range on one rank only: an error on both, not a hang.
        try {
          acc.pad_across_processes(torch::ones({2, 2}), acc.process_index() == 0 ? 1 : 2);
          require(false, "dim 2 of a 2-d tensor was accepted");
        } catch (const hasten::UsageError& e) {
          require(std::string(e.what()).find("out of range") != std::string::npos, e.what());
        }
      },
      two_ranks());
}

// A peer that left is reported as having left, at once: the launch's own deadline (30 s) is
// shorter than the collective timeout (60 s), so a rank that waited it out fails this test.
TEST(Lifecycle, DebugModeSaysAPeerLeftInsteadOfWaitingItsTimeout) {
  hasten::test::TempDir dir;
  const std::string file = (dir.path() / "rank0.txt").string();
  EXPECT_THROW(hasten::launch(
                   [file] {
                     Accelerator acc;
                     if (acc.process_index() == 1) return;  // destroys its Accelerator, exits
                     try {
                       acc.gather(torch::ones({2}));
                     } catch (const hasten::UsageError& e) {
                       std::ofstream(file) << e.what();
                       throw;
                     }
                   },
                   two_ranks({{"HASTEN_DEBUG", "1"}}, 30)),
               hasten::Error);
  const std::string text = read(file);
  EXPECT_NE(text.find("debug: rank 1 will not reach collective #0"), std::string::npos) << text;
  EXPECT_NE(text.find("it left"), std::string::npos) << text;
  EXPECT_EQ(text.find("within"), std::string::npos) << text;
}

TEST(Lifecycle, DebugModeSaysAPeerProcessExited) {
  hasten::test::TempDir dir;
  const std::string file = (dir.path() / "rank0.txt").string();
  EXPECT_THROW(hasten::launch(
                   [file] {
                     Accelerator acc;
                     if (acc.process_index() == 1) std::_Exit(0);  // no destructor: gone without a word
                     try {
                       acc.gather(torch::ones({2}));
                     } catch (const hasten::UsageError& e) {
                       std::ofstream(file) << e.what();
                       throw;
                     }
                   },
                   two_ranks({{"HASTEN_DEBUG", "1"}}, 30)),
               hasten::Error);
  const std::string text = read(file);
  EXPECT_NE(text.find("debug: rank 1 will not reach collective #0"), std::string::npos) << text;
  EXPECT_NE(text.find("exited"), std::string::npos) << text;
}

// Rank 0 hosts the store: when it leaves, rank 1 hears so (it left, or its store is gone).
TEST(Lifecycle, DebugModeSaysTheStoreHostLeft) {
  hasten::test::TempDir dir;
  const std::string file = (dir.path() / "rank1.txt").string();
  EXPECT_THROW(hasten::launch(
                   [file] {
                     Accelerator acc;
                     if (acc.process_index() == 0) return;
                     try {
                       acc.gather(torch::ones({2}));
                     } catch (const hasten::UsageError& e) {
                       std::ofstream(file) << e.what();
                       throw;
                     }
                   },
                   two_ranks({{"HASTEN_DEBUG", "1"}}, 30)),
               hasten::Error);
  const std::string text = read(file);
  EXPECT_NE(text.find("debug: rank 0 "), std::string::npos) << text;
  EXPECT_TRUE(text.find("it left") != std::string::npos || text.find("rank 0, exited or failed") != std::string::npos ||
              text.find("rank 0, is gone") != std::string::npos)
      << text;
  EXPECT_EQ(text.find("within"), std::string::npos) << text;
}

TEST(Lifecycle, DebugModeSwitchesAtRunTime) {
  // Off to on: mismatched shapes are named on every rank.
  auto errors = usage_errors([](Accelerator& acc) {
    require(!acc.debug(), "debug mode starts off");
    acc.set_debug(true);
    require(acc.debug(), "debug() reports the switch");
    acc.gather(torch::ones({acc.process_index() + 2, 3}));
  });
  for (auto& e : errors)
    EXPECT_NE(e.find("rank 0: gather Float[2, 3]; rank 1: gather Float[3, 3]"), std::string::npos) << e;
  // On to off: tensors of the same size in bytes but not of the same shape go through
  // unchecked (gather has no check of its own on shapes beyond dim 0's bytes).
  hasten::launch(
      [] {
        Accelerator acc;
        require(acc.debug(), "HASTEN_DEBUG=1 starts it on");
        acc.set_debug(false);
        auto t = acc.gather(acc.process_index() == 0 ? torch::ones({2, 3}) : torch::ones({3, 2}));
        require(t.numel() == 12, "gathered both ranks' 6 values");
      },
      two_ranks({{"HASTEN_DEBUG", "1"}}));
}

// ---- per-loader even_batches and split_batches -----------------------------------------

TEST(Lifecycle, ALoadersEvenAndSplitBatchesOverrideTheAccelerators) {
  hasten::launch(
      [] {
        hasten::Options o;
        o.even_batches = false;  // the Accelerator's: loaders that say nothing go uneven
        Accelerator acc(o);
        const int rank = acc.process_index();
        hasten::TensorDataset data(torch::arange(9).unsqueeze(1), torch::arange(9));
        auto sizes = [&](auto& loader) {
          std::vector<int64_t> out;
          for (auto& batch : loader) out.push_back(batch.size());
          return out;
        };
        // 9 samples, 2 per rank per batch: rounds [0 1 | 2 3] [4 5 | 6 7] [8 | -].
        hasten::DataLoader uneven_data(data, {.batch_size = 2});
        auto uneven = acc.prepare(uneven_data);
        const auto u = sizes(uneven);
        require(u == (rank == 0 ? std::vector<int64_t>{2, 2, 1} : std::vector<int64_t>{2, 2}),
                "the Accelerator's even_batches=false: rank " + std::to_string(rank) + " got " + c10::str(u));
        hasten::DataLoader even_data(data, {.batch_size = 2, .even_batches = true});
        auto even = acc.prepare(even_data);
        const auto e = sizes(even);
        require(e == std::vector<int64_t>{2, 2, 2}, "the loader's even_batches=true pads: got " + c10::str(e));
        // split_batches per loader: batch_size is the global batch, each rank takes half.
        hasten::DataLoader split_data(data, {.batch_size = 4, .split_batches = true});
        auto split = acc.prepare(split_data);
        const auto s = sizes(split);
        require(s == (rank == 0 ? std::vector<int64_t>{2, 2, 1} : std::vector<int64_t>{2, 2}),
                "the loader's split_batches=true: rank " + std::to_string(rank) + " got " + c10::str(s));
      },
      two_ranks());
}

}  // namespace lifecycle_tests
