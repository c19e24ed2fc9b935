// Data loading: epoch plans sharded by rank, padding, shuffling, collation.
#include <hasten/data.hpp>
#include <hasten/error.hpp>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <set>
#include <stdexcept>
#include <thread>

using hasten::detail::EpochPlan;
using hasten::detail::ShardSpec;

namespace {

ShardSpec spec(int64_t n, int64_t batch, int64_t world, int64_t rank, bool shuffle = false) {
  ShardSpec s;
  s.dataset_size = n;
  s.options.batch_size = batch;
  s.options.shuffle = shuffle;
  s.options.seed = 7;
  s.world_size = world;
  s.rank = rank;
  return s;
}

std::vector<std::vector<int64_t>> batches(const ShardSpec& s, int64_t epoch = 0,
                                          std::vector<int64_t>* pads = nullptr) {
  EpochPlan plan = hasten::detail::make_epoch_plan(s, epoch);
  std::vector<std::vector<int64_t>> out;
  for (int64_t b = 0; b < plan.num_batches; ++b) {
    int64_t pad = 0;
    out.push_back(plan.batch(b, &pad));
    if (pads) pads->push_back(pad);
  }
  EXPECT_EQ(static_cast<int64_t>(out.size()), hasten::detail::count_batches(s));
  return out;
}

using V = std::vector<std::vector<int64_t>>;

}  // namespace

TEST(EpochPlan, RankRTakesTheRthSliceOfEachGlobalBatch) {
  EXPECT_EQ(batches(spec(8, 2, 2, 0)), (V{{0, 1}, {4, 5}}));
  EXPECT_EQ(batches(spec(8, 2, 2, 1)), (V{{2, 3}, {6, 7}}));
}

TEST(EpochPlan, EvenBatchesPadTheLastRoundAndMarkIt) {
  // 9 samples, batch 5, 2 ranks: rank 1's batch is completed with sample 0.
  std::vector<int64_t> p0, p1;
  EXPECT_EQ(batches(spec(9, 5, 2, 0), 0, &p0), (V{{0, 1, 2, 3, 4}}));
  EXPECT_EQ(batches(spec(9, 5, 2, 1), 0, &p1), (V{{5, 6, 7, 8, 0}}));
  EXPECT_EQ(p0, (std::vector<int64_t>{0}));
  EXPECT_EQ(p1, (std::vector<int64_t>{1}));
}

TEST(EpochPlan, UnevenBatchesOnlyRealSamples) {
  ShardSpec s0 = spec(9, 2, 2, 0), s1 = spec(9, 2, 2, 1);
  s0.even_batches = s1.even_batches = false;
  EXPECT_EQ(batches(s0), (V{{0, 1}, {4, 5}, {8}}));
  EXPECT_EQ(batches(s1), (V{{2, 3}, {6, 7}}));
}

TEST(EpochPlan, DropLastAndOneProcess) {
  ShardSpec s = spec(9, 2, 2, 1);
  s.options.drop_last = true;
  EXPECT_EQ(batches(s), (V{{2, 3}, {6, 7}}));
  EXPECT_EQ(batches(spec(5, 2, 1, 0)), (V{{0, 1}, {2, 3}, {4}}));  // a short last batch, no padding
}

TEST(EpochPlan, SplitBatchesDividesTheGlobalBatch) {
  ShardSpec s = spec(8, 4, 2, 1);
  s.split_batches = true;
  EXPECT_EQ(batches(s), (V{{2, 3}, {6, 7}}));
  s.options.batch_size = 3;
  EXPECT_THROW(hasten::detail::count_batches(s), hasten::Error);
}

TEST(EpochPlan, ShuffleIsOneGlobalOrderPerEpoch) {
  std::set<int64_t> seen;
  for (int64_t r = 0; r < 2; ++r)
    for (auto& b : batches(spec(20, 5, 2, r, true)))
      for (auto i : b) EXPECT_TRUE(seen.insert(i).second) << "sample " << i << " twice";
  EXPECT_EQ(seen.size(), 20u);  // the ranks' shares partition the dataset
  EXPECT_EQ(batches(spec(20, 5, 2, 0, true), 0), batches(spec(20, 5, 2, 0, true), 0));  // deterministic
  EXPECT_NE(batches(spec(20, 5, 2, 0, true), 0), batches(spec(20, 5, 2, 0, true), 1));  // new each epoch
}

TEST(DataLoader, IteratesEpochsAndCollates) {
  struct Squares {
    size_t size() const { return 5; }
    torch::data::Example<> get(size_t i) {
      auto v = static_cast<float>(i);
      return {torch::tensor({v, v * v}), torch::tensor(static_cast<int64_t>(i))};
    }
  };
  hasten::DataLoader loader(Squares{}, {.batch_size = 2});
  EXPECT_EQ(loader.size(), 3u);
  std::vector<int64_t> sizes;
  for (auto& b : loader) sizes.push_back(b.size());
  EXPECT_EQ(sizes, (std::vector<int64_t>{2, 2, 1}));
  auto it = loader.begin();  // the next epoch
  EXPECT_TRUE(torch::equal(it->input, torch::tensor({{0.f, 0.f}, {1.f, 1.f}})));
  EXPECT_TRUE(torch::equal(it->target, torch::tensor({0, 1}, torch::kLong)));
}

TEST(TensorDataset, ConsecutiveIndicesAreViews) {
  auto x = torch::arange(20).reshape({10, 2});
  hasten::TensorDataset ds(x, torch::arange(10));
  auto b = ds.get_batch({2, 3, 4});
  EXPECT_EQ(b.input.data_ptr<int64_t>(), x.data_ptr<int64_t>() + 4);  // no copy
  auto c = ds.get_batch({5, 1});
  EXPECT_TRUE(torch::equal(c.target, torch::tensor({5, 1}, torch::kLong)));
  EXPECT_THROW(hasten::TensorDataset(x, torch::arange(9)), hasten::Error);
}

TEST(Batch, RealMaskDropsPadding) {
  hasten::Batch b;
  b.indices = torch::tensor({5, 6, 0}, torch::kLong);
  b.num_padding = 1;
  EXPECT_TRUE(torch::equal(b.real_mask(), torch::tensor({true, true, false})));
}

// num_workers: worker threads fetch ahead, and the batches come out in the epoch's order, so
// they are bitwise those one thread reads, for any number of workers and prefetch depth.
namespace workers_tests {

// A dataset whose get() costs a little and depends only on the index (a worker may run it on
// any thread); `fail_at` makes one sample throw.
struct Squares {
  int64_t n = 100;
  int64_t fail_at = -1;
  size_t size() const { return static_cast<size_t>(n); }
  torch::data::Example<> get(size_t i) const {
    if (static_cast<int64_t>(i) == fail_at) throw std::runtime_error("sample " + std::to_string(i) + " is unreadable");
    std::this_thread::sleep_for(std::chrono::microseconds(200 * static_cast<int64_t>(i % 3)));  // uneven costs
    const auto x = static_cast<float>(i);
    return {torch::full({3}, x * x), torch::tensor(static_cast<int64_t>(i) % 7)};
  }
};

std::vector<hasten::Batch> epochs(hasten::DataLoaderOptions o, int count) {
  hasten::DataLoader loader(Squares{}, o);
  std::vector<hasten::Batch> out;
  for (int e = 0; e < count; ++e)
    for (auto& b : loader) out.push_back(b);
  return out;
}

}  // namespace workers_tests

TEST(DataLoaderWorkers, BatchesAreTheSameForAnyNumberOfWorkers) {
  hasten::DataLoaderOptions o;
  o.batch_size = 7;
  o.shuffle = true;
  o.seed = 3;
  const auto one_thread = workers_tests::epochs(o, 2);
  ASSERT_EQ(one_thread.size(), 2u * 15u);
  for (int workers : {1, 2, 4}) {
    for (int prefetch : {1, 3}) {
      auto w = o;
      w.num_workers = workers;
      w.prefetch_factor = prefetch;
      const auto got = workers_tests::epochs(w, 2);
      ASSERT_EQ(got.size(), one_thread.size());
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_TRUE(torch::equal(got[i].input, one_thread[i].input)) << workers << " workers, batch " << i;
        EXPECT_TRUE(torch::equal(got[i].target, one_thread[i].target)) << workers << " workers, batch " << i;
        EXPECT_TRUE(torch::equal(got[i].indices, one_thread[i].indices)) << workers << " workers, batch " << i;
        EXPECT_EQ(got[i].num_padding, one_thread[i].num_padding);
      }
    }
  }
}

TEST(DataLoaderWorkers, AWorkersErrorNamesTheBatchAndItsSamplesAndEndsTheLoopCleanly) {
  hasten::DataLoaderOptions o;
  o.batch_size = 10;
  o.num_workers = 3;
  hasten::DataLoader loader(workers_tests::Squares{100, 42}, o);
  int seen = 0;
  try {
    for (auto& b : loader) {
      (void)b;
      ++seen;
    }
    FAIL() << "sample 42 throws: the loop must end with an error";
  } catch (const hasten::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("a worker failed to read batch 4 (samples 40, 41, 42"), std::string::npos) << what;
    EXPECT_NE(what.find("sample 42 is unreadable"), std::string::npos) << what;
  }
  EXPECT_EQ(seen, 4);  // batches 0-3 came through, in order
  // Breaking out of a loop early stops the workers (the test would hang in the join if not).
  hasten::DataLoader again(workers_tests::Squares{}, o);
  for (auto& b : again) {
    (void)b;
    break;
  }
}

TEST(DataLoaderWorkers, OptionsAreChecked) {
  auto refused = [](hasten::DataLoaderOptions o, const std::string& expect) {
    try {
      hasten::DataLoader loader(workers_tests::Squares{}, o);
      for (auto& b : loader) (void)b;
      ADD_FAILURE() << "accepted: " << expect;
    } catch (const hasten::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
    }
  };
  hasten::DataLoaderOptions o;
  o.num_workers = -1;
  refused(o, "num_workers must be from 0 to 256, got -1");
  o.num_workers = 0;
  o.prefetch_factor = 2;
  refused(o, "prefetch_factor is the batches each worker fetches ahead; it needs num_workers > 0");
  o.num_workers = 2;
  o.prefetch_factor = 0;
  refused(o, "prefetch_factor must be from 1 to 1024, got 0");
}

namespace named_tests {

// Token sequences of different lengths as named tensors, as a language-model dataset gives
// them: sample i has i % 5 + 1 tokens, all equal to i.
struct Sequences {
  int64_t n = 23;
  size_t size() const { return static_cast<size_t>(n); }
  hasten::TensorDict get(size_t i) const {
    const auto len = static_cast<int64_t>(i % 5 + 1);
    auto ids = torch::full({len}, static_cast<int64_t>(i));
    return {{"input_ids", ids}, {"labels", ids + 1}};
  }
};

// Pads every sequence to the batch's longest (-100 in labels, as Hugging Face's collators do)
// and adds the attention mask.
hasten::Batch pad_to_longest(std::vector<hasten::TensorDict> samples) {
  int64_t longest = 0;
  for (auto& s : samples) longest = std::max(longest, s.at("input_ids").size(0));
  const auto n = static_cast<int64_t>(samples.size());
  hasten::Batch b;
  b.fields["input_ids"] = torch::zeros({n, longest}, torch::kLong);
  b.fields["attention_mask"] = torch::zeros({n, longest}, torch::kLong);
  b.fields["labels"] = torch::full({n, longest}, -100, torch::kLong);
  for (int64_t k = 0; k < n; ++k) {
    const int64_t len = samples[k].at("input_ids").size(0);
    b.fields["input_ids"][k].narrow(0, 0, len).copy_(samples[k].at("input_ids"));
    b.fields["labels"][k].narrow(0, 0, len).copy_(samples[k].at("labels"));
    b.fields["attention_mask"][k].narrow(0, 0, len).fill_(1);
  }
  return b;
}

// Fixed-length samples: stacked without a collate function.
struct Pairs {
  size_t size() const { return 10; }
  hasten::TensorDict get(size_t i) const {
    return {{"x", torch::full({2}, static_cast<float>(i))}, {"y", torch::tensor(static_cast<int64_t>(i))}};
  }
};

}  // namespace named_tests

TEST(NamedBatches, SamplesOfNamedTensorsAreStackedByName) {
  hasten::DataLoader loader(named_tests::Pairs{}, {.batch_size = 4});
  std::vector<int64_t> seen;
  for (auto& b : loader) {
    EXPECT_EQ(b["x"].size(1), 2);
    EXPECT_TRUE(torch::equal(b["x"].select(1, 0).to(torch::kLong), b["y"]));
    EXPECT_TRUE(torch::equal(b["y"], b.indices));
    EXPECT_EQ(b.size(), b["y"].size(0));
    EXPECT_FALSE(b.input.defined());
    for (auto i : std::vector<int64_t>(b.indices.data_ptr<int64_t>(), b.indices.data_ptr<int64_t>() + b.size()))
      seen.push_back(i);
  }
  EXPECT_EQ(seen.size(), 10u);
  hasten::DataLoader again(named_tests::Pairs{}, {.batch_size = 4});
  try {
    (void)(*again.begin())["input_ids"];
    FAIL() << "expected an error";
  } catch (const hasten::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("no field 'input_ids' (it has 'x', 'y')"), std::string::npos) << e.what();
  }
}

TEST(NamedBatches, ACollateFunctionPadsAndBatchesAreTheSameForAnyNumberOfWorkers) {
  auto epoch = [](int workers) {
    hasten::DataLoaderOptions o;
    o.batch_size = 4;
    o.shuffle = true;
    o.seed = 5;
    o.num_workers = workers;
    o.collate = named_tests::pad_to_longest;
    hasten::DataLoader loader(named_tests::Sequences{}, o);
    std::vector<hasten::Batch> out;
    for (auto& b : loader) out.push_back(b);
    return out;
  };
  const auto one = epoch(0);
  ASSERT_EQ(one.size(), 6u);
  for (auto& b : one) {
    const auto lengths = b["attention_mask"].sum(1);
    for (int64_t k = 0; k < b.size(); ++k) {
      const int64_t i = b.indices[k].item<int64_t>();
      EXPECT_EQ(lengths[k].item<int64_t>(), i % 5 + 1) << "sample " << i;
      EXPECT_EQ(b["input_ids"][k][0].item<int64_t>(), i);
    }
    EXPECT_EQ(b["input_ids"].size(1), lengths.max().item<int64_t>());  // padded to the longest
  }
  for (int workers : {1, 3}) {
    const auto got = epoch(workers);
    ASSERT_EQ(got.size(), one.size());
    for (size_t i = 0; i < got.size(); ++i)
      for (const char* name : {"input_ids", "attention_mask", "labels"})
        EXPECT_TRUE(torch::equal(got[i][name], one[i][name])) << workers << " workers, batch " << i << ", " << name;
  }
}

TEST(NamedBatches, WhatCannotBeBatchedIsOneClearError) {
  auto first_error = [](hasten::DataLoaderOptions o) -> std::string {
    try {
      hasten::DataLoader loader(named_tests::Sequences{}, o);
      for (auto& b : loader) (void)b;
    } catch (const hasten::Error& e) {
      return e.what();
    }
    return "";
  };
  hasten::DataLoaderOptions o;
  o.batch_size = 4;
  EXPECT_NE(first_error(o).find("field 'input_ids' of the samples 0..3 has different shapes and cannot be stacked "
                                "(give a collate function"),
            std::string::npos);
  o.collate = [](std::vector<hasten::TensorDict> samples) {
    hasten::Batch b;
    b.fields["input_ids"] = samples.front().at("input_ids");  // one sample's tokens, not the batch's
    return b;
  };
  EXPECT_NE(first_error(o).find("the collate function's field 'input_ids' does not hold the batch's 4 samples "
                                "along dim 0 (it has 1)"),
            std::string::npos);
  try {
    hasten::DataLoader loader(hasten::TensorDataset(torch::zeros({4, 2}), torch::zeros({4})),
                              {.batch_size = 2, .collate = named_tests::pad_to_longest});
    FAIL() << "collate on a get_batch dataset was accepted";
  } catch (const hasten::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("collate applies to map-style datasets whose get(size_t) returns a sample"),
              std::string::npos)
        << e.what();
  }
}
