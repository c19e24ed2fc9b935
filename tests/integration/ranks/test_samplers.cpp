// Prepared loaders beyond a map-style dataset's own order: user samplers and batch samplers
// (sharded like Accelerate's BatchSamplerShard, seeded like its SeedableRandomSampler),
// stream datasets (IterableDatasetShard), set_epoch and skip_first_batches. The expected
// shard lists are those of Accelerate's tests/test_data_loader.py; the 2-rank checks translate
// src/accelerate/test_utils/scripts/test_distributed_data_loop.py.
#include <hasten/hasten.hpp>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "test_tensor_util.hpp"
#include "test_util.hpp"

// Named, so that a unity build of this file with others has no clashing helper names.
namespace sampler_tests {

using hasten::Accelerator;
using hasten::test::Lists;

namespace {

hasten::Options isolated() {
  hasten::test::isolate_home();
  return {};
}

using hasten::test::require;
using hasten::test::str;
using hasten::test::to_vector;
using hasten::test::with_ranks;

Lists range_batches(int64_t n, int64_t batch_size, bool drop_last) {
  return hasten::SamplerBatches(std::make_shared<hasten::SequentialSampler>(n), batch_size, drop_last).batches(0);
}

// BatchSamplerShard on 2 processes: both ranks' batches, and (without split_batches, as
// Accelerate's check_batch_sampler_shards) that each is what it is.
void check_shards(const Lists& batches, std::optional<int64_t> batch_size, bool drop_last, const Lists& rank0,
                  const Lists& rank1, bool split = false, bool even = true) {
  const Lists expected[2] = {rank0, rank1};
  for (int64_t r = 0; r < 2; ++r) {
    Lists got;
    for (auto& b : hasten::detail::shard_batches(batches, batch_size, drop_last, 2, r, split, even))
      got.push_back(b.indices);
    EXPECT_EQ(got, expected[r]) << "rank " << r << " of " << str(batches) << (split ? " split" : "")
                                << (even ? "" : " uneven") << (drop_last ? " drop_last" : "") << ": got "
                                << str(got);
  }
}

void check_range(int64_t n, int64_t bs, bool drop_last, const Lists& rank0, const Lists& rank1, bool split = false,
                 bool even = true) {
  check_shards(range_batches(n, bs, drop_last), bs, drop_last, rank0, rank1, split, even);
}

// A dataset whose samples are their own index (TensorDataset of arange).
hasten::TensorDataset numbers(int64_t n) { return hasten::TensorDataset(torch::arange(n), torch::arange(n) % 2); }

// A stream of n samples whose data is their number; set_epoch is recorded and shifts nothing.
struct Counting {
  int64_t n = 0;
  int64_t next_value = 0;
  std::shared_ptr<std::vector<int64_t>> epochs = std::make_shared<std::vector<int64_t>>();
  std::optional<torch::data::Example<>> next() {
    if (next_value >= n) return std::nullopt;
    auto v = next_value++;
    return torch::data::Example<>(torch::tensor(v * 10), torch::tensor(v % 2));
  }
  void reset() { next_value = 0; }
  void set_epoch(int64_t e) { epochs->push_back(e); }
};

}  // namespace

// ---- BatchSamplerShard (test_data_loader.py) -------------------------------------------

TEST(BatchSamplerShard, NoSplits) {
  const Lists full0 = {{0, 1, 2}, {6, 7, 8}, {12, 13, 14}, {18, 19, 20}};
  check_range(24, 3, false, full0, {{3, 4, 5}, {9, 10, 11}, {15, 16, 17}, {21, 22, 23}});
  check_range(24, 3, true, full0, {{3, 4, 5}, {9, 10, 11}, {15, 16, 17}, {21, 22, 23}});
  check_range(21, 3, false, full0, {{3, 4, 5}, {9, 10, 11}, {15, 16, 17}, {0, 1, 2}});
  const Lists drop0 = {{0, 1, 2}, {6, 7, 8}, {12, 13, 14}}, drop1 = {{3, 4, 5}, {9, 10, 11}, {15, 16, 17}};
  check_range(21, 3, true, drop0, drop1);
  check_range(22, 3, false, full0, {{3, 4, 5}, {9, 10, 11}, {15, 16, 17}, {21, 0, 1}});
  check_range(22, 3, true, drop0, drop1);
  check_range(20, 3, false, {{0, 1, 2}, {6, 7, 8}, {12, 13, 14}, {18, 19, 0}},
              {{3, 4, 5}, {9, 10, 11}, {15, 16, 17}, {1, 2, 3}});
  check_range(20, 3, true, drop0, drop1);
  check_range(2, 3, false, {{0, 1, 0}}, {{1, 0, 1}});
  check_range(2, 3, true, {}, {});
}

TEST(BatchSamplerShard, Splits) {
  const Lists a = {{0, 1}, {4, 5}, {8, 9}, {12, 13}, {16, 17}, {20, 21}};
  const Lists b = {{2, 3}, {6, 7}, {10, 11}, {14, 15}, {18, 19}, {22, 23}};
  check_range(24, 4, false, a, b, true);
  check_range(24, 4, true, a, b, true);
  check_range(22, 4, false, a, {{2, 3}, {6, 7}, {10, 11}, {14, 15}, {18, 19}, {0, 1}}, true);
  const Lists d0 = {{0, 1}, {4, 5}, {8, 9}, {12, 13}, {16, 17}}, d1 = {{2, 3}, {6, 7}, {10, 11}, {14, 15}, {18, 19}};
  check_range(22, 4, true, d0, d1, true);
  check_range(21, 4, false, {{0, 1}, {4, 5}, {8, 9}, {12, 13}, {16, 17}, {20, 0}},
              {{2, 3}, {6, 7}, {10, 11}, {14, 15}, {18, 19}, {1, 2}}, true);
  check_range(21, 4, true, d0, d1, true);
  check_range(2, 4, false, {{0, 1}}, {{0, 1}}, true);
  check_range(2, 4, true, {}, {}, true);
}

TEST(BatchSamplerShard, NoSplitsNoEven) {
  const Lists full0 = {{0, 1, 2}, {6, 7, 8}, {12, 13, 14}, {18, 19, 20}};
  const Lists drop0 = {{0, 1, 2}, {6, 7, 8}, {12, 13, 14}}, drop1 = {{3, 4, 5}, {9, 10, 11}, {15, 16, 17}};
  check_range(24, 3, false, full0, {{3, 4, 5}, {9, 10, 11}, {15, 16, 17}, {21, 22, 23}}, false, false);
  check_range(21, 3, false, full0, drop1, false, false);
  check_range(21, 3, true, drop0, drop1, false, false);
  check_range(22, 3, false, full0, {{3, 4, 5}, {9, 10, 11}, {15, 16, 17}, {21}}, false, false);
  check_range(22, 3, true, drop0, drop1, false, false);
  check_range(20, 3, false, {{0, 1, 2}, {6, 7, 8}, {12, 13, 14}, {18, 19}}, drop1, false, false);
  check_range(20, 3, true, drop0, drop1, false, false);
  check_range(2, 3, false, {{0, 1}}, {}, false, false);
  check_range(2, 3, true, {}, {}, false, false);
}

TEST(BatchSamplerShard, SplitsNoEven) {
  const Lists a = {{0, 1}, {4, 5}, {8, 9}, {12, 13}, {16, 17}, {20, 21}};
  const Lists d1 = {{2, 3}, {6, 7}, {10, 11}, {14, 15}, {18, 19}};
  check_range(24, 4, false, a, {{2, 3}, {6, 7}, {10, 11}, {14, 15}, {18, 19}, {22, 23}}, true, false);
  check_range(22, 4, false, a, d1, true, false);
  check_range(21, 4, false, {{0, 1}, {4, 5}, {8, 9}, {12, 13}, {16, 17}, {20}}, d1, true, false);
  check_range(21, 4, true, {{0, 1}, {4, 5}, {8, 9}, {12, 13}, {16, 17}}, d1, true, false);
  check_range(2, 4, false, {{0, 1}}, {}, true, false);
  check_range(2, 4, true, {}, {}, true, false);
}

TEST(BatchSamplerShard, VaryingBatchSizes) {
  const Lists five = {{0, 1, 2}, {3, 4}, {5, 6, 7, 8}, {9, 10, 11}, {12, 13}};
  check_shards(five, std::nullopt, false, {{0, 1, 2}, {5, 6, 7, 8}, {12, 13}}, {{3, 4}, {9, 10, 11}}, false, false);
  check_shards({{0, 1, 2}, {3, 4}, {5, 6, 7, 8}, {9, 10, 11}}, std::nullopt, false, {{0, 1, 2}, {5, 6, 7, 8}},
               {{3, 4}, {9, 10, 11}});
  check_shards(five, std::nullopt, false, {{0, 1, 2}, {5, 6, 7, 8}, {12, 13}}, {{3, 4}, {9, 10, 11}, {0, 1, 2}});
  check_shards({{0, 1, 2}}, std::nullopt, false, {{0, 1, 2}}, {{0, 1, 2}});
  check_shards(five, std::nullopt, true, {{0, 1, 2}, {5, 6, 7, 8}}, {{3, 4}, {9, 10, 11}});
  // Three processes.
  const Lists seven = {{0}, {1, 2}, {3, 4, 5}, {6}, {7, 8}, {9, 10, 11}, {12, 13}};
  const Lists expected[3] = {{{0}, {6}, {12, 13}}, {{1, 2}, {7, 8}, {0}}, {{3, 4, 5}, {9, 10, 11}, {1, 2}}};
  for (int64_t r = 0; r < 3; ++r) {
    Lists got;
    for (auto& b : hasten::detail::shard_batches(seven, std::nullopt, false, 3, r, false, true)) got.push_back(b.indices);
    EXPECT_EQ(got, expected[r]) << "rank " << r << ": " << str(got);
  }
  Lists one_each[3];
  for (int64_t r = 0; r < 3; ++r)
    for (auto& b : hasten::detail::shard_batches({{0, 1, 2}}, std::nullopt, false, 3, r, false, true))
      one_each[r].push_back(b.indices);
  for (auto& l : one_each) EXPECT_EQ(l, (Lists{{0, 1, 2}}));
}

TEST(BatchSamplerShard, PaddingIsCounted) {
  // range(20), batch 3: rank 0's last batch [18, 19, 0] has one sample of padding, rank 1's
  // [1, 2, 3] is all padding; split: [20, 0] one, [1, 2] two.
  auto r0 = hasten::detail::shard_batches(range_batches(20, 3, false), 3, false, 2, 0, false, true);
  auto r1 = hasten::detail::shard_batches(range_batches(20, 3, false), 3, false, 2, 1, false, true);
  ASSERT_EQ(r0.size(), 4u);
  ASSERT_EQ(r1.size(), 4u);
  EXPECT_EQ(r0[2].num_padding, 0);
  EXPECT_EQ(r0[3].num_padding, 1);
  EXPECT_EQ(r1[3].num_padding, 3);
  auto s0 = hasten::detail::shard_batches(range_batches(21, 4, false), 4, false, 2, 0, true, true);
  auto s1 = hasten::detail::shard_batches(range_batches(21, 4, false), 4, false, 2, 1, true, true);
  EXPECT_EQ(s0.back().num_padding, 1);
  EXPECT_EQ(s1.back().num_padding, 2);
  // Varying sizes: the padding batch is all padding.
  auto v1 = hasten::detail::shard_batches({{0, 1, 2}, {3, 4}, {5, 6, 7, 8}, {9, 10, 11}, {12, 13}}, std::nullopt,
                                          false, 2, 1, false, true);
  EXPECT_EQ(v1.back().num_padding, 3);
  EXPECT_EQ(v1.front().num_padding, 0);
}

TEST(BatchSamplerShard, SplitBatchesNeedsADivisibleFixedSize) {
  try {
    hasten::detail::shard_batches({{0, 1, 2, 3}, {4, 5, 6, 7}}, std::nullopt, false, 2, 0, true, true);
    FAIL() << "varying sizes with split_batches";
  } catch (const hasten::Error& e) {
    EXPECT_NE(std::string(e.what()).find("split_batches"), std::string::npos) << e.what();
  }
  EXPECT_THROW(hasten::detail::shard_batches(range_batches(20, 3, false), 3, false, 2, 0, true, true), hasten::Error);
}

// ---- samplers through the loader -----------------------------------------------------

TEST(Samplers, RandomSamplerIsSeededWithSeedPlusEpoch) {
  hasten::RandomSampler a(10, 5), b(10, 5), c(10, 6);
  EXPECT_EQ(a.indices(2), b.indices(2));
  EXPECT_NE(a.indices(0), a.indices(1));
  EXPECT_EQ(a.indices(1), c.indices(0));  // seed 5 + epoch 1 == seed 6 + epoch 0
  auto order = a.indices(3);
  std::sort(order.begin(), order.end());
  EXPECT_EQ(order, hasten::SequentialSampler(10).indices(0));
  // With replacement and a number of samples of its own.
  hasten::RandomSampler r(4, 1, true, 9);
  auto drawn = r.indices(0);
  ASSERT_EQ(drawn.size(), 9u);
  for (auto i : drawn) EXPECT_TRUE(i >= 0 && i < 4) << i;
  // Without replacement, more samples than the dataset: whole permutations, then part of one.
  auto more = hasten::RandomSampler(4, 1, false, 6).indices(0);
  ASSERT_EQ(more.size(), 6u);
  std::vector<int64_t> first4(more.begin(), more.begin() + 4);
  std::sort(first4.begin(), first4.end());
  EXPECT_EQ(first4, (std::vector<int64_t>{0, 1, 2, 3}));
}

TEST(Samplers, ARandomSamplerGivesTheOrderOfShuffleWithTheSameSeed) {
  hasten::DataLoader shuffled(numbers(10), {.batch_size = 3, .shuffle = true, .seed = 4});
  hasten::DataLoader sampled(numbers(10), {.batch_size = 3, .sampler = std::make_shared<hasten::RandomSampler>(10, 4)});
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<int64_t> a, b;
    for (auto& batch : shuffled) for (auto i : to_vector(batch.indices)) a.push_back(i);
    for (auto& batch : sampled) for (auto i : to_vector(batch.indices)) b.push_back(i);
    EXPECT_EQ(a, b) << "epoch " << epoch;
    EXPECT_EQ(b, hasten::RandomSampler(10, 4).indices(epoch));
  }
}

TEST(Samplers, ASubsetSamplerVisitsOnlyItsIndices) {
  struct Evens : hasten::Sampler {
    int64_t size() const override { return 5; }
    std::vector<int64_t> indices(int64_t) const override { return {8, 6, 4, 2, 0}; }
  };
  hasten::DataLoader loader(numbers(10), {.batch_size = 2, .sampler = std::make_shared<Evens>()});
  Lists got;
  for (auto& b : loader) got.push_back(to_vector(b.input));
  EXPECT_EQ(got, (Lists{{8, 6}, {4, 2}, {0}}));
  EXPECT_EQ(loader.size(), 3u);
}

TEST(Samplers, BadSamplersAndCombinationsAreRefusedWithOneLine) {
  auto expect_usage = [](auto&& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no error, expected one naming " << needle;
    } catch (const hasten::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto sampler = std::make_shared<hasten::RandomSampler>(10, 1);
  auto batches = std::make_shared<hasten::SamplerBatches>(sampler, 4);
  expect_usage([&] { hasten::DataLoader l(numbers(10), {.shuffle = true, .sampler = sampler}); l.begin(); },
               "sampler and shuffle");
  expect_usage([&] { hasten::DataLoader l(numbers(10), {.batch_size = 4, .batch_sampler = batches}); l.begin(); },
               "batch_sampler");
  struct OutOfRange : hasten::Sampler {
    int64_t size() const override { return 2; }
    std::vector<int64_t> indices(int64_t) const override { return {1, 30}; }
  };
  expect_usage([&] { hasten::DataLoader l(numbers(10), {.sampler = std::make_shared<OutOfRange>()}); l.begin(); },
               "index 30");
  struct WrongSize : hasten::Sampler {
    int64_t size() const override { return 3; }
    std::vector<int64_t> indices(int64_t) const override { return {1}; }
  };
  expect_usage([&] { hasten::DataLoader l(numbers(10), {.sampler = std::make_shared<WrongSize>()}); l.begin(); },
               "size() is 3");
  expect_usage([] { hasten::SamplerBatches(nullptr, 2); }, "null");
  expect_usage([] { hasten::RandomSampler(-1); }, ">= 0");
}

// ---- set_epoch, skip_first_batches -----------------------------------------------------

TEST(SetEpoch, ChoosesTheShuffleOfThatEpoch) {
  Accelerator acc(isolated());
  hasten::DataLoader data(numbers(12), {.batch_size = 4, .shuffle = true, .seed = 9});
  auto loader = acc.prepare(data);
  EXPECT_EQ(loader.epoch(), 0);
  loader.set_epoch(3);
  EXPECT_EQ(loader.epoch(), 3);
  std::vector<int64_t> seen;
  for (auto& b : loader) {
    EXPECT_EQ(loader.epoch(), 3);
    for (auto i : to_vector(b.indices)) seen.push_back(i);
  }
  EXPECT_EQ(seen, hasten::RandomSampler(12, 9).indices(3));
  EXPECT_EQ(loader.epoch(), 4);  // the next iteration continues from there
  // Inside the loop, and a negative epoch: one line each.
  for (auto& b : loader) {
    (void)b;
    EXPECT_THROW(loader.set_epoch(0), hasten::UsageError);
    break;
  }
  EXPECT_THROW(loader.set_epoch(-1), hasten::UsageError);
  // The unprepared loader too.
  hasten::DataLoader plain(numbers(12), {.batch_size = 12, .shuffle = true, .seed = 9});
  plain.set_epoch(2);
  EXPECT_EQ(to_vector(plain.begin()->indices), hasten::RandomSampler(12, 9).indices(2));
  EXPECT_EQ(plain.epoch(), 3);
}

TEST(SetEpoch, ReachesAUserBatchSampler) {
  // Accelerate's test_set_epoch_in_batch_sampler: the batch sampler is asked for the epoch set.
  struct Recording : hasten::BatchSampler {
    std::shared_ptr<std::vector<int64_t>> asked = std::make_shared<std::vector<int64_t>>();
    std::vector<std::vector<int64_t>> batches(int64_t epoch) const override {
      asked->push_back(epoch);
      return hasten::SamplerBatches(std::make_shared<hasten::RandomSampler>(16, 12), 4).batches(epoch);
    }
    std::optional<int64_t> batch_size() const override { return 4; }
  };
  auto sampler = std::make_shared<Recording>();
  Accelerator acc(isolated());
  hasten::DataLoader data(numbers(16), {.batch_sampler = sampler});
  auto loader = acc.prepare(data);
  loader.set_epoch(1);
  sampler->asked->clear();
  Lists got;
  for (auto& b : loader) got.push_back(to_vector(b.indices));
  EXPECT_EQ(*sampler->asked, (std::vector<int64_t>{1}));
  EXPECT_EQ(got, hasten::SamplerBatches(std::make_shared<hasten::RandomSampler>(16, 12), 4).batches(1));
}

TEST(SetEpoch, ComposesWithCheckpointResume) {
  hasten::test::TempDir dir;
  const auto ckpt = (dir.path() / "ckpt").string();
  Lists epoch1, epoch2;
  {
    Accelerator acc(isolated());
    hasten::DataLoader data(numbers(20), {.batch_size = 4, .shuffle = true, .seed = 5});
    auto loader = acc.prepare(data);
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      loader.set_epoch(epoch);
      int64_t step = 0;
      for (auto& b : loader) {
        if (epoch == 1) epoch1.push_back(to_vector(b.indices));
        if (epoch == 2) epoch2.push_back(to_vector(b.indices));
        if (epoch == 1 && step++ == 1) acc.save_state(ckpt);  // after batch 1 of epoch 1
      }
    }
  }
  ASSERT_EQ(epoch1.size(), 5u);
  {
    // The usual loop after load_state: set_epoch(the checkpoint's epoch) continues mid-epoch.
    Accelerator acc(isolated());
    hasten::DataLoader data(numbers(20), {.batch_size = 4, .shuffle = true, .seed = 5});
    auto loader = acc.prepare(data);
    acc.load_state(ckpt);
    EXPECT_EQ(loader.epoch(), 1);
    Lists resumed, next;
    for (int64_t epoch = loader.epoch(); epoch < 3; ++epoch) {
      loader.set_epoch(epoch);
      for (auto& b : loader) (epoch == 1 ? resumed : next).push_back(to_vector(b.indices));
    }
    EXPECT_EQ(resumed, Lists(epoch1.begin() + 2, epoch1.end()));
    EXPECT_EQ(next, epoch2);
  }
  {
    // Another epoch than the checkpoint's starts at its first batch.
    Accelerator acc(isolated());
    hasten::DataLoader data(numbers(20), {.batch_size = 4, .shuffle = true, .seed = 5});
    auto loader = acc.prepare(data);
    acc.load_state(ckpt);
    loader.set_epoch(2);
    Lists got;
    for (auto& b : loader) got.push_back(to_vector(b.indices));
    EXPECT_EQ(got, epoch2);
  }
}

TEST(SkipFirstBatches, SkipsTheFirstBatchesOfEachEpoch) {
  // Accelerate's test_skip_first_batches: 16 samples, batch 4, skip 2.
  Accelerator acc(isolated());
  hasten::DataLoader data(numbers(16), {.batch_size = 4});
  auto loader = acc.prepare(data);
  auto skipped = hasten::skip_first_batches(loader, 2);
  EXPECT_EQ(skipped.size(), 2u);
  EXPECT_EQ(loader.size(), 4u);
  Lists got;
  for (auto& b : skipped) got.push_back(to_vector(b.input));
  EXPECT_EQ(got, (Lists{{8, 9, 10, 11}, {12, 13, 14, 15}}));
  // One loader, one epoch count: the original continues with the next epoch, in full.
  EXPECT_EQ(loader.epoch(), 1);
  got.clear();
  for (auto& b : loader) got.push_back(to_vector(b.input));
  EXPECT_EQ(got.size(), 4u);
  EXPECT_THROW(hasten::skip_first_batches(loader, -1), hasten::UsageError);
  // More batches than the epoch has: nothing.
  int n = 0;
  for (auto& b : hasten::skip_first_batches(loader, 9)) (void)b, ++n;
  EXPECT_EQ(n, 0);
}

TEST(SkipFirstBatches, DoesNotSkipTwiceAfterLoadState) {
  hasten::test::TempDir dir;
  const auto ckpt = (dir.path() / "ckpt").string();
  Lists all;
  {
    Accelerator acc(isolated());
    hasten::DataLoader data(numbers(24), {.batch_size = 4, .shuffle = true, .seed = 2});
    auto loader = acc.prepare(data);
    int step = 0;
    for (auto& b : loader) {
      all.push_back(to_vector(b.indices));
      if (step++ == 2) acc.save_state(ckpt);  // three batches seen
    }
  }
  Accelerator acc(isolated());
  hasten::DataLoader data(numbers(24), {.batch_size = 4, .shuffle = true, .seed = 2});
  auto loader = acc.prepare(data);
  acc.load_state(ckpt);
  Lists got;
  for (auto& b : hasten::skip_first_batches(loader, 3)) got.push_back(to_vector(b.indices));  // Accelerate's resume
  EXPECT_EQ(got, Lists(all.begin() + 3, all.end()));
}

// ---- stream datasets, one process --------------------------------------------------------

TEST(StreamDataset, OneProcessHasPlainBatches) {
  hasten::DataLoader loader(Counting{.n = 10}, {.batch_size = 4});
  Lists got;
  for (auto& b : loader) {
    got.push_back(to_vector(b.indices));
    EXPECT_EQ(b.num_padding, 0);
    EXPECT_TRUE(torch::equal(b.input, b.indices * 10));
  }
  EXPECT_EQ(got, (Lists{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}}));
  hasten::DataLoader dropping(Counting{.n = 10}, {.batch_size = 4, .drop_last = true});
  got.clear();
  for (auto& b : dropping) got.push_back(to_vector(b.indices));
  EXPECT_EQ(got, (Lists{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_THROW(loader.size(), hasten::UsageError);
  hasten::DataLoader shuffled(Counting{.n = 10}, {.batch_size = 4, .shuffle = true});
  EXPECT_THROW(shuffled.begin(), hasten::UsageError);
}

TEST(StreamDataset, PreparedLoaderTellsTheDatasetItsEpochAndSyncsOnTheLastBatch) {
  hasten::Options o = isolated();
  o.gradient_accumulation_steps = 100;
  Accelerator acc(o);
  auto net = torch::nn::Linear(1, 1);
  Counting stream{.n = 9};
  auto epochs = stream.epochs;
  hasten::DataLoader data(stream, {.batch_size = 2});
  auto [model, loader] = acc.prepare(net, data);
  loader.set_epoch(4);
  std::vector<bool> syncs;
  for (auto& b : loader) {
    auto scope = acc.accumulate(model);
    syncs.push_back(acc.sync_gradients());
    acc.backward(model(b.input.to(torch::kFloat).unsqueeze(1)).sum());
  }
  EXPECT_EQ(syncs, (std::vector<bool>{false, false, false, false, true}));
  for (auto& b : loader) (void)b;
  EXPECT_EQ(*epochs, (std::vector<int64_t>{4, 5}));
}

// ---- 2 ranks (test_distributed_data_loop.py) ---------------------------------------------

namespace {

// Every rank's concatenated index lists, in rank order; the ranks must have as many.
std::vector<std::vector<int64_t>> per_rank(Accelerator& acc, const std::vector<int64_t>& mine) {
  auto counts = to_vector(acc.gather(torch::tensor({static_cast<int64_t>(mine.size())})));
  for (auto c : counts) require(c == counts[0], "ranks have different numbers of samples");
  std::vector<std::vector<int64_t>> out(counts.size());
  if (counts[0] == 0) return out;
  auto all = to_vector(acc.gather(torch::tensor(mine, torch::kLong)));
  for (size_t r = 0; r < counts.size(); ++r)
    out[r].assign(all.begin() + static_cast<std::ptrdiff_t>(r * counts[0]),
                  all.begin() + static_cast<std::ptrdiff_t>((r + 1) * counts[0]));
  return out;
}

// test_data_loader: every element of the 22 once, gathered for metrics batch by batch.
template <class Loader>
void each_sample_once(Accelerator& acc, Loader& loader, const std::string& what) {
  std::vector<int64_t> all;
  for (auto& batch : loader)
    for (auto i : to_vector(acc.gather_for_metrics(batch.indices))) all.push_back(i);
  std::sort(all.begin(), all.end());
  require(all == hasten::SequentialSampler(22).indices(0), what + ": each of the 22 samples once, got " +
                                                               c10::str(torch::tensor(all)));
}

}  // namespace

TEST(DistributedDataLoop, SamplersAndBatchSamplersCoverTheDatasetOnce) {
  hasten::launch(
      [] {
        Accelerator acc;
        const auto rank = acc.process_index();
        auto sampler = std::make_shared<hasten::RandomSampler>(22, 3);
        auto batches = std::make_shared<hasten::SamplerBatches>(sampler, 4);
        hasten::DataLoader plain(numbers(22), {.batch_size = 4});
        hasten::DataLoader shuffled(numbers(22), {.batch_size = 4, .shuffle = true, .seed = 1});
        hasten::DataLoader sampled(numbers(22), {.batch_size = 4, .sampler = sampler});
        hasten::DataLoader batched(numbers(22), {.batch_sampler = batches});
        auto [a, b, c, d] = acc.prepare(plain, shuffled, sampled, batched);
        each_sample_once(acc, a, "shuffle=false");
        each_sample_once(acc, b, "shuffle=true");
        each_sample_once(acc, c, "sampler");
        each_sample_once(acc, d, "batch_sampler");
        // The batch sampler's epoch 1 dealt as BatchSamplerShard deals it: exact lists.
        Lists got;
        std::vector<int64_t> pads;
        for (auto& batch : d) got.push_back(to_vector(batch.indices)), pads.push_back(batch.num_padding);
        Lists expected;
        std::vector<int64_t> expected_pads;
        for (auto& s : hasten::detail::shard_batches(batches->batches(1), 4, false, 2, rank, false, true))
          expected.push_back(s.indices), expected_pads.push_back(s.num_padding);
        require(got == expected && pads == expected_pads, "rank " + std::to_string(rank) + ": " + str(got));
        // 22 in batches of 4: 6 batches, rank 0 gets 0, 2, 4; rank 1 gets 1, 3, 5 (short: 2
        // real samples and 2 of padding).
        require(got.size() == 3, "3 batches each");
        require(pads == std::vector<int64_t>{0, 0, rank == 1 ? 2 : 0}, "padding on rank 1's last batch");
        const auto order = sampler->indices(1);
        require(got[0] == std::vector<int64_t>(order.begin() + 4 * rank, order.begin() + 4 * rank + 4),
                "the first batch is the rank-th of the sampler's");
        const std::vector<int64_t> last =
            rank == 0 ? std::vector<int64_t>(order.begin() + 16, order.begin() + 20)
                      : std::vector<int64_t>{order[20], order[21], order[0], order[1]};  // completed from the start
        require(got[2] == last, "rank " + std::to_string(rank) + "'s last batch: " + str(got));
        // A whole epoch's outputs, gathered after the loop: the padding is dropped once.
        std::vector<torch::Tensor> outs;
        for (auto& batch : d) outs.push_back(batch.indices);
        auto epoch = to_vector(acc.gather_for_metrics(torch::cat(outs)));
        std::sort(epoch.begin(), epoch.end());
        require(epoch == hasten::SequentialSampler(22).indices(0), "epoch-level gather_for_metrics drops padding");
        // The sampler's shares: the same global order on both ranks, rank r the r-th slice.
        c.set_epoch(5);
        std::vector<int64_t> mine;
        for (auto& batch : c) for (auto i : to_vector(batch.indices)) mine.push_back(i);
        auto ranks = per_rank(acc, mine);
        const auto order5 = sampler->indices(5);
        for (int64_t r = 0; r < 2; ++r)
          for (size_t k = 0; k < ranks[r].size(); ++k) {
            const size_t p = (k / 4 * 2 + r) * 4 + k % 4;  // batch k/4 of rank r in round k/4
            require(ranks[r][k] == order5[p % order5.size()], "sampler share of rank " + std::to_string(r));
          }
      },
      with_ranks(2));
}

TEST(DistributedDataLoop, BatchSamplersUnderSplitAndUnevenBatches) {
  // One Accelerator per launch: a second one in the same process is issue 15's item 2.
  hasten::launch(
      [] {
        hasten::Options split;
        split.split_batches = true;
        {
          Accelerator acc(split);
          auto batches = std::make_shared<hasten::SamplerBatches>(std::make_shared<hasten::SequentialSampler>(21), 4);
          hasten::DataLoader data(numbers(21), {.batch_sampler = batches});
          auto loader = acc.prepare(data);
          Lists got;
          for (auto& b : loader) got.push_back(to_vector(b.indices));
          const Lists expected = acc.process_index() == 0
                                     ? Lists{{0, 1}, {4, 5}, {8, 9}, {12, 13}, {16, 17}, {20, 0}}
                                     : Lists{{2, 3}, {6, 7}, {10, 11}, {14, 15}, {18, 19}, {1, 2}};
          require(got == expected, "split: " + str(got));
          require(loader.size() == 6, "split: 6 batches");
          acc.wait_for_everyone();  // no rank leaves before all have joined (issue 15, item 2)
        }
      },
      with_ranks(2));
  hasten::launch(
      [] {
        hasten::Options uneven;
        uneven.even_batches = false;
        Accelerator acc(uneven);
        auto varying = std::make_shared<hasten::ListBatchSampler>(Lists{{0, 1, 2}, {3, 4}, {5, 6, 7, 8}, {9, 10, 11}, {12, 13}});
        hasten::DataLoader data(numbers(14), {.batch_sampler = varying});
        auto loader = acc.prepare(data);
        Lists got;
        for (auto& b : loader) got.push_back(to_vector(b.indices));
        const Lists expected =
            acc.process_index() == 0 ? Lists{{0, 1, 2}, {5, 6, 7, 8}, {12, 13}} : Lists{{3, 4}, {9, 10, 11}};
        require(got == expected, "uneven, varying sizes: " + str(got));
        require(loader.size() == expected.size(), "size() is this rank's number of batches");
        acc.wait_for_everyone();
      },
      with_ranks(2));
}

TEST(DistributedDataLoop, StreamDatasetsAreShardedLikeIterableDatasetShard) {
  // Accelerate's check_iterable_dataset_shards (dispatch_batches false; on, the default for a
  // stream, is test_dispatch.cpp's): the ranks' slices, interleaved, are the stream (repeated
  // from its start when the last round is completed).
  for (bool split : {false, true}) {
    hasten::launch(
      [split] {
        {
          hasten::Options o;
          o.split_batches = split;
          o.dispatch_batches = false;
          Accelerator acc(o);
          for (int64_t n : {2, 8, 13, 16}) {
            for (bool drop_last : {false, true}) {
              const std::string what = "n=" + std::to_string(n) + (split ? " split" : "") + (drop_last ? " drop_last" : "");
              hasten::DataLoader data(Counting{.n = n}, {.batch_size = 4, .drop_last = drop_last});
              auto loader = acc.prepare(data);
              std::vector<int64_t> mine, metrics;
              int64_t padding = 0;
              for (auto& b : loader) {
                for (auto i : to_vector(b.indices)) mine.push_back(i);
                for (auto i : to_vector(acc.gather_for_metrics(b.indices))) metrics.push_back(i);
                padding += b.num_padding;
                require(torch::equal(b.input, b.indices * 10), what + ": the samples of the indices");
              }
              // gather_for_metrics drops the completing samples: each sample read once.
              std::sort(metrics.begin(), metrics.end());
              const int64_t kept = drop_last ? n / (split ? 4 : 8) * (split ? 4 : 8) : n;
              require(metrics == hasten::SequentialSampler(kept).indices(0),
                      what + ": gather_for_metrics " + c10::str(torch::tensor(metrics)));
              const int64_t shard = split ? 2 : 4;
              require(mine.size() % static_cast<size_t>(shard) == 0, what + ": whole batches");
              auto ranks = per_rank(acc, mine);
              std::vector<int64_t> observed;
              for (size_t k = 0; k < ranks[0].size(); k += static_cast<size_t>(shard))
                for (auto& l : ranks) observed.insert(observed.end(), l.begin() + k, l.begin() + k + shard);
              std::vector<int64_t> reference = hasten::SequentialSampler(n).indices(0);
              if (!drop_last)
                while (reference.size() < observed.size()) {
                  auto copy = reference;
                  reference.insert(reference.end(), copy.begin(), copy.end());
                }
              require(observed == std::vector<int64_t>(reference.begin(), reference.begin() + observed.size()),
                      what + ": observed " + c10::str(torch::tensor(observed)));
              const int64_t round = split ? 4 : 8;
              const int64_t expected_total = drop_last ? n / round * round : (n + round - 1) / round * round;
              require(static_cast<int64_t>(observed.size()) == expected_total, what + ": number of samples");
              const int64_t all_padding = acc.reduce(torch::tensor({padding})).sum().item<int64_t>();
              require(all_padding == expected_total - std::min(n, expected_total), what + ": padding counted");
            }
          }
        }
      },
      with_ranks(2));
  }
}

TEST(DistributedDataLoop, LoadersResumeFromSaveStateMidEpoch) {
  // test_stateful_dataloader_save_state: saved at step 2, loaded after the loop, the resumed
  // batches are the ones not yet seen; a sampler loader and a stream loader.
  hasten::test::TempDir dir;
  const std::string ckpt = (dir.path() / "ckpt").string();
  hasten::launch(
      [ckpt] {
        Accelerator acc;
        auto sampler = std::make_shared<hasten::RandomSampler>(64, 8);
        hasten::DataLoader sampled(numbers(64), {.batch_size = 4, .sampler = sampler});
        hasten::DataLoader streamed(Counting{.n = 64}, {.batch_size = 4, .dispatch_batches = false});
        auto [a, b] = acc.prepare(sampled, streamed);
        Lists unseen_a, unseen_b, resumed_a, resumed_b;
        auto it_b = b.begin();
        int step = 0;
        for (auto& batch : a) {
          require(it_b != b.end(), "as many batches");
          auto from_b = to_vector(it_b->indices);  // both loaders have yielded batch `step`
          if (step == 2) acc.save_state(ckpt);
          if (step > 2) unseen_a.push_back(to_vector(batch.indices)), unseen_b.push_back(from_b);
          ++it_b, ++step;
        }
        require(!(it_b != b.end()), "the stream has 8 batches per rank too");
        acc.load_state(ckpt);
        for (auto& batch : a) resumed_a.push_back(to_vector(batch.indices));
        for (auto& batch : b) resumed_b.push_back(to_vector(batch.indices));
        require(resumed_a == unseen_a, "sampler loader: " + str(resumed_a) + " vs " + str(unseen_a));
        require(resumed_b == unseen_b, "stream loader: " + str(resumed_b) + " vs " + str(unseen_b));
        require(unseen_a.size() == 5, "8 batches per rank, 3 seen before the save");
      },
      with_ranks(2));
}

TEST(DistributedDataLoop, SkipFirstBatchesOnTwoRanks) {
  hasten::launch(
      [] {
        Accelerator acc;
        hasten::DataLoader data(numbers(16), {.batch_size = 2});
        auto loader = acc.prepare(data);
        Lists got;
        for (auto& b : hasten::skip_first_batches(loader, 2)) got.push_back(to_vector(b.indices));
        const Lists expected = acc.process_index() == 0 ? Lists{{8, 9}, {12, 13}} : Lists{{10, 11}, {14, 15}};
        require(got == expected, "rank " + std::to_string(acc.process_index()) + ": " + str(got));
        acc.wait_for_everyone();
      },
      with_ranks(2));
}

}  // namespace sampler_tests
