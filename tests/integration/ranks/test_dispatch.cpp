// dispatch_batches (Accelerate's DataLoaderDispatcher) on 2 ranks, and skip_first_batches of a
// loader that was not prepared. The expected batches follow DataLoaderDispatcher's code step by
// step (src/accelerate/data_loader.py): rank 0 reads N batches of the user's loader (one with
// split_batches), the round is broadcast, rank r keeps rows [r*k, (r+1)*k) with k = rows / N;
// a last round the ranks do not divide gets the first N rows of the epoch's first round and
// k + 1 rows per rank; drop_last drops a round short of batches. The 2-rank checks translate
// test_script.py's central_dl_preparation_check and test_data_loader.py's dispatcher tests.
#include <hasten/hasten.hpp>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "test_tensor_util.hpp"
#include "test_util.hpp"

// Named, so that a unity build of this file with others has no clashing helper names.
namespace dispatch_tests {

using hasten::Accelerator;
using hasten::test::Lists;
using hasten::test::require;
using hasten::test::str;
using hasten::test::to_vector;

namespace {

using hasten::test::with_ranks;

// A map-style dataset whose samples are their index, counting the batches fetched in this process.
struct Numbers {
  hasten::TensorDataset data;
  std::shared_ptr<int64_t> fetched = std::make_shared<int64_t>(0);
  explicit Numbers(int64_t n) : data(torch::arange(n), torch::arange(n) * 10) {}
  size_t size() const { return data.size(); }
  hasten::Batch get_batch(const std::vector<int64_t>& indices) const {
    ++*fetched;
    return data.get_batch(indices);
  }
};

// A stream of n samples (data: its number, target: ten times it), counting next() calls.
struct Stream {
  int64_t n = 0;
  int64_t next_value = 0;
  std::shared_ptr<int64_t> reads = std::make_shared<int64_t>(0);
  std::optional<torch::data::Example<>> next() {
    ++*reads;
    if (next_value >= n) return std::nullopt;
    auto v = next_value++;
    return torch::data::Example<>(torch::tensor(v), torch::tensor(v * 10));
  }
  void reset() { next_value = 0; }
};

// One case of DataLoaderDispatcher on 2 ranks: the batches each rank receives and, per batch,
// how many rows pad.
struct Case {
  int64_t n, batch_size;
  bool split, drop_last;
  Lists rank0, rank1;
  int64_t padding1;  // rank 1's padding rows in the epoch (rank 0's is 0 in every case here)
};

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      // Batches [0..3] [4..7] [8,9]: the last round has 2 samples, one each.
      {10, 4, false, false, {{0, 1, 2, 3}, {8}}, {{4, 5, 6, 7}, {9}}, 0},
      // Batches of 2 and a last [8]: 1 sample, completed by the first round's first 2 rows.
      {9, 2, false, false, {{0, 1}, {4, 5}, {8}}, {{2, 3}, {6, 7}, {0}}, 1},
      // drop_last: the loader drops [8,9]; the second round has no batch.
      {10, 4, false, true, {{0, 1, 2, 3}}, {{4, 5, 6, 7}}, 0},
      // drop_last: [8..11] alone is a round short of a batch, dropped.
      {12, 4, false, true, {{0, 1, 2, 3}}, {{4, 5, 6, 7}}, 0},
      // One short batch is the whole epoch: [0,1,2] + [0,1], 2 rows each.
      {3, 4, false, false, {{0, 1}}, {{2, 0}}, 1},
      // split_batches: one batch per round, halved; the last [8,9] one each.
      {10, 4, true, false, {{0, 1}, {4, 5}, {8}}, {{2, 3}, {6, 7}, {9}}, 0},
      // split_batches, a last [8]: completed by [0,1].
      {9, 4, true, false, {{0, 1}, {4, 5}, {8}}, {{2, 3}, {6, 7}, {0}}, 1},
      // split_batches with drop_last.
      {10, 4, true, true, {{0, 1}, {4, 5}}, {{2, 3}, {6, 7}}, 0},
  };
  return all;
}

std::string name(const Case& c) {
  return "n=" + std::to_string(c.n) + " batch_size=" + std::to_string(c.batch_size) + (c.split ? " split" : "") +
         (c.drop_last ? " drop_last" : "");
}

// Iterates one epoch of a dispatching loader and checks every batch against the case.
template <class Loader>
void check_case(Accelerator& acc, Loader& loader, const Case& c, const std::string& what) {
  const bool rank0 = acc.process_index() == 0;
  const Lists& expected = rank0 ? c.rank0 : c.rank1;
  Lists got;
  std::vector<int64_t> metrics;
  std::vector<bool> ends;
  int64_t padding = 0;
  for (auto& b : loader) {
    got.push_back(to_vector(b.indices));
    require(torch::equal(b.input.to(torch::kLong), b.indices), what + ": the data of the indices");
    require(torch::equal(b.target.to(torch::kLong), b.indices * 10), what + ": the targets of the indices");
    padding += b.num_padding;
    ends.push_back(acc.gradient_state().end_of_dataloader);
    for (auto i : to_vector(acc.gather_for_metrics(b.indices))) metrics.push_back(i);
  }
  require(got == expected, what + ": rank " + std::to_string(acc.process_index()) + " got " + str(got) +
                               ", expected " + str(expected));
  require(padding == (rank0 ? 0 : c.padding1), what + ": padding counted");
  std::vector<bool> expected_ends(expected.size(), false);
  if (!expected_ends.empty()) expected_ends.back() = true;
  require(ends == expected_ends, what + ": end_of_dataloader only at the last batch");
  // gather_for_metrics drops the completing rows: every sample the loader kept, once.
  std::sort(metrics.begin(), metrics.end());
  std::vector<int64_t> kept;
  for (const auto* l : {&c.rank0, &c.rank1})
    for (auto& b : *l) kept.insert(kept.end(), b.begin(), b.end());
  std::sort(kept.begin(), kept.end());
  kept.erase(std::unique(kept.begin(), kept.end()), kept.end());
  require(metrics == kept, what + ": gather_for_metrics " + c10::str(torch::tensor(metrics)));
}

}  // namespace

// ---- central_dl_preparation_check (test_script.py) ----------------------------------------

TEST(Dispatch, CentralDataLoaderPreparationCheck) {
  hasten::launch(
      [] {
        Accelerator acc;
        const int64_t length = 32 * acc.num_processes();
        std::vector<int64_t> arange(static_cast<size_t>(length));
        for (int64_t i = 0; i < length; ++i) arange[static_cast<size_t>(i)] = i;
        for (bool shuffle : {false, true}) {
          for (bool split : {false, true}) {
            const std::string what = std::string(shuffle ? "shuffled" : "non-shuffled") + (split ? " split" : "");
            hasten::DataLoader data(Numbers(length), {.batch_size = 8, .shuffle = shuffle, .seed = 3,
                                                      .split_batches = split, .dispatch_batches = true});
            auto loader = acc.prepare(data);
            std::vector<int64_t> result;
            for (auto& b : loader)
              for (auto i : to_vector(acc.gather(b.input))) result.push_back(i);
            if (shuffle) std::sort(result.begin(), result.end());
            require(result == arange, "Wrong " + what + " dataloader result: " + c10::str(torch::tensor(result)));
            // Only rank 0 read the dataset.
            const int64_t fetched = *loader.dataset().fetched;
            require(acc.process_index() == 0 ? fetched == length / 8 : fetched == 0,
                    what + ": rank " + std::to_string(acc.process_index()) + " fetched " + std::to_string(fetched) +
                        " batches");
          }
        }
        acc.wait_for_everyone();
      },
      with_ranks(2));
}

TEST(Dispatch, ShuffledRoundsAreTheUserLoadersBatchesSliced) {
  // Rank r's batch b: rows [r*8, (r+1)*8) of the user loader's batches 2b and 2b+1, so rank 0
  // gets batch 2b and rank 1 batch 2b+1 of the one-process order (its seed and epoch).
  hasten::launch(
      [] {
        Accelerator acc;
        hasten::DataLoaderOptions options{.batch_size = 8, .shuffle = true, .seed = 11};
        Lists reference;
        hasten::DataLoader plain(Numbers(64), options);
        plain.set_epoch(1);
        for (auto& b : plain) reference.push_back(to_vector(b.indices));
        options.dispatch_batches = true;
        hasten::DataLoader data(Numbers(64), options);
        auto loader = acc.prepare(data);
        loader.set_epoch(1);
        Lists got, expected;
        for (auto& b : loader) got.push_back(to_vector(b.indices));
        for (size_t k = static_cast<size_t>(acc.process_index()); k < reference.size(); k += 2)
          expected.push_back(reference[k]);
        require(got == expected, "epoch 1: " + str(got) + " vs " + str(expected));
        require(loader.size() == 4, "4 rounds");
      },
      with_ranks(2));
}

// ---- the exact batches, map-style and stream -------------------------------------------

TEST(Dispatch, EachRankGetsDataLoaderDispatchersSlices) {
  hasten::launch(
      [] {
        hasten::Options o;
        o.dispatch_batches = true;  // the config key: every map-style loader dispatches
        Accelerator acc(o);
        for (const Case& c : cases()) {
          hasten::DataLoader data(Numbers(c.n),
                                  {.batch_size = c.batch_size, .drop_last = c.drop_last, .split_batches = c.split});
          auto loader = acc.prepare(data);
          require(loader.size() == c.rank0.size(), name(c) + ": size() " + std::to_string(loader.size()));
          check_case(acc, loader, c, name(c));
          // A second epoch: the same batches (no shuffle).
          check_case(acc, loader, c, name(c) + " epoch 2");
          require(acc.process_index() == 0 || *loader.dataset().fetched == 0, name(c) + ": rank 1 fetched");
          // After the loop, the epoch's outputs: each rank's padding dropped.
          std::vector<int64_t> mine;
          for (auto& b : loader) {
            auto v = to_vector(b.indices);
            mine.insert(mine.end(), v.begin(), v.end());
          }
          auto all = to_vector(acc.gather_for_metrics(torch::tensor(mine, torch::kLong)));
          std::sort(all.begin(), all.end());
          std::vector<int64_t> kept;
          for (const auto* l : {&c.rank0, &c.rank1})
            for (auto& b : *l) kept.insert(kept.end(), b.begin(), b.end());
          std::sort(kept.begin(), kept.end());
          kept.erase(std::unique(kept.begin(), kept.end()), kept.end());
          require(all == kept, name(c) + ": gather_for_metrics after the loop " + c10::str(torch::tensor(all)));
        }
        // The loader's own option wins over the config: sharded (BatchSamplerShard), the last
        // round completed to full batches.
        hasten::DataLoader sharded(Numbers(10), {.batch_size = 4, .dispatch_batches = false});
        auto loader = acc.prepare(sharded);
        Lists got;
        for (auto& b : loader) got.push_back(to_vector(b.indices));
        const Lists expected =
            acc.process_index() == 0 ? Lists{{0, 1, 2, 3}, {8, 9, 0, 1}} : Lists{{4, 5, 6, 7}, {2, 3, 4, 5}};
        require(got == expected, "dispatch_batches false: " + str(got));
        require(*loader.dataset().fetched > 0, "every rank reads a sharded loader");
      },
      with_ranks(2));
}

TEST(Dispatch, StreamDatasetsDispatchByDefault) {
  // Accelerate's default for an IterableDataset: rank 0 reads the stream in batches of
  // batch_size, the same rounds as a map-style dataset of the same samples.
  hasten::launch(
      [] {
        Accelerator acc;
        for (const Case& c : cases()) {
          hasten::DataLoader data(Stream{.n = c.n},
                                  {.batch_size = c.batch_size, .drop_last = c.drop_last, .split_batches = c.split});
          auto loader = acc.prepare(data);
          check_case(acc, loader, c, "stream " + name(c));
          const int64_t reads = *loader.dataset().reads;
          require(acc.process_index() == 0 ? reads > 0 : reads == 0,
                  "stream " + name(c) + ": rank " + std::to_string(acc.process_index()) + " read " +
                      std::to_string(reads) + " samples");
        }
      },
      with_ranks(2));
}

TEST(Dispatch, AccumulateSyncsOnTheLastDispatchedBatch) {
  hasten::launch(
      [] {
        hasten::Options o;
        o.strategy = "ddp";
        o.gradient_accumulation_steps = 100;
        Accelerator acc(o);
        auto net = torch::nn::Linear(1, 1);
        hasten::DataLoader data(Stream{.n = 9}, {.batch_size = 2});
        auto [model, loader] = acc.prepare(net, data);
        std::vector<bool> syncs;
        for (auto& b : loader) {
          auto scope = acc.accumulate(model);
          syncs.push_back(acc.sync_gradients());
          acc.backward(model(b.input.to(torch::kFloat).unsqueeze(1)).sum());
        }
        require(syncs == std::vector<bool>{false, false, true}, "3 rounds, the last one syncs");
      },
      with_ranks(2));
}

TEST(Dispatch, SkipFirstBatchesAndResumeCountRounds) {
  // Skipped rounds are not sent; the padding of the last round still comes from the epoch's
  // first round, which a map-style loader reads again and a stream read on its way.
  hasten::test::TempDir dir;
  const std::string ckpt = (dir.path() / "ckpt").string();
  hasten::launch(
      [ckpt] {
        Accelerator acc;
        hasten::DataLoader data(Numbers(9), {.batch_size = 2, .dispatch_batches = true});
        hasten::DataLoader stream(Stream{.n = 9}, {.batch_size = 2});
        auto [a, b] = acc.prepare(data, stream);
        const Lists expected = acc.process_index() == 0 ? Lists{{4, 5}, {8}} : Lists{{6, 7}, {0}};
        Lists got_a, got_b;
        auto skipped_a = hasten::skip_first_batches(a, 1);
        auto skipped_b = hasten::skip_first_batches(b, 1);
        require(skipped_a.size() == 2, "3 rounds less 1");
        for (auto& batch : skipped_a) got_a.push_back(to_vector(batch.indices));
        for (auto& batch : skipped_b) got_b.push_back(to_vector(batch.indices));
        require(got_a == expected, "map-style: " + str(got_a));
        require(got_b == expected, "stream: " + str(got_b));
        // save_state after the first round, load_state: the rest of the epoch.
        int step = 0;
        for (auto& batch : a) {
          (void)batch;
          if (step++ == 0) acc.save_state(ckpt);
        }
        acc.load_state(ckpt);
        Lists resumed;
        for (auto& batch : a) resumed.push_back(to_vector(batch.indices));
        require(resumed == expected, "resumed: " + str(resumed));
      },
      with_ranks(2));
}

TEST(Dispatch, BadOptionsAreOneClearError) {
  hasten::launch(
      [] {
        Accelerator acc;
        hasten::DataLoader data(Numbers(12), {.batch_size = 3, .split_batches = true, .dispatch_batches = true});
        try {
          (void)acc.prepare(data);
          require(false, "split_batches with a batch size of 3 on 2 processes was accepted");
        } catch (const hasten::Error& e) {
          require(std::string(e.what()).find("divisible by the 2 processes") != std::string::npos, e.what());
        }
      },
      with_ranks(2));
}

// ---- skip_first_batches of a loader that was not prepared (one process) -----------------

TEST(SkipFirstBatches, UnpreparedLoader) {
  // Accelerate's test_skip_first_batches: DataLoader(range(16), batch_size=4), skip 2.
  hasten::DataLoader loader(Numbers(16), {.batch_size = 4});
  auto skipped = hasten::skip_first_batches(loader, 2);
  EXPECT_EQ(skipped.size(), 2u);
  EXPECT_EQ(skipped.skipped_batches(), 2);
  EXPECT_EQ(loader.size(), 4u);
  Lists got;
  for (auto& b : skipped) got.push_back(to_vector(b.input));
  EXPECT_EQ(got, (Lists{{8, 9, 10, 11}, {12, 13, 14, 15}}));
  // The skipped batches were not fetched.
  EXPECT_EQ(*loader.dataset().fetched, 2);
  // Every iteration of the copy skips them (Accelerate's SkipBatchSampler); the loader it came
  // from is whole.
  got.clear();
  for (auto& b : skipped) got.push_back(to_vector(b.input));
  EXPECT_EQ(got, (Lists{{8, 9, 10, 11}, {12, 13, 14, 15}}));
  got.clear();
  for (auto& b : loader) got.push_back(to_vector(b.input));
  EXPECT_EQ(got.size(), 4u);
  // More batches than an epoch has: none; a negative count: one line.
  EXPECT_EQ(hasten::skip_first_batches(loader, 9).size(), 0u);
  int n = 0;
  for (auto& b : hasten::skip_first_batches(loader, 9)) (void)b, ++n;
  EXPECT_EQ(n, 0);
  try {
    (void)hasten::skip_first_batches(loader, -1);
    ADD_FAILURE() << "a negative count was accepted";
  } catch (const hasten::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("num_batches must be >= 0, got -1"), std::string::npos) << e.what();
  }
}

TEST(SkipFirstBatches, UnpreparedLoaderKeepsItsEpochAndShuffle) {
  // Accelerate's test_skip_first_batches_preserves_iteration: the copy continues at the
  // loader's epoch, so its order is that epoch's.
  hasten::DataLoader loader(Numbers(20), {.batch_size = 4, .shuffle = true, .seed = 7});
  loader.set_epoch(3);
  auto skipped = hasten::skip_first_batches(loader, 3);
  EXPECT_EQ(skipped.epoch(), 3);
  Lists whole, rest;
  for (auto& b : loader) whole.push_back(to_vector(b.indices));
  for (auto& b : skipped) rest.push_back(to_vector(b.indices));
  ASSERT_EQ(whole.size(), 5u);
  EXPECT_EQ(rest, Lists(whole.begin() + 3, whole.end()));
}

TEST(SkipFirstBatches, UnpreparedStream) {
  // Accelerate's SkipDataLoader over an iterable dataset: the stream is read past them.
  hasten::DataLoader loader(Stream{.n = 10}, {.batch_size = 4});
  Lists got;
  for (auto& b : hasten::skip_first_batches(loader, 1)) got.push_back(to_vector(b.input));
  EXPECT_EQ(got, (Lists{{4, 5, 6, 7}, {8, 9}}));
  got.clear();
  for (auto& b : hasten::skip_first_batches(loader, 3)) got.push_back(to_vector(b.input));
  EXPECT_TRUE(got.empty());
}

// ---- batches of named tensors on 2 ranks --------------------------------------------------

namespace {
// Samples of different lengths as named tensors: sample i has i % 3 + 1 tokens equal to i.
struct Tokens {
  int64_t n = 11;
  size_t size() const { return static_cast<size_t>(n); }
  hasten::TensorDict get(size_t i) const {
    auto ids = torch::full({static_cast<int64_t>(i % 3 + 1)}, static_cast<int64_t>(i));
    return {{"input_ids", ids}, {"length", torch::tensor(ids.size(0))}};
  }
};
hasten::Batch pad(std::vector<hasten::TensorDict> samples) {
  int64_t longest = 0;
  for (auto& s : samples) longest = std::max(longest, s.at("input_ids").size(0));
  hasten::Batch b;
  b.fields["input_ids"] = torch::full({static_cast<int64_t>(samples.size()), longest}, int64_t{-1});
  std::vector<torch::Tensor> lengths;
  for (size_t k = 0; k < samples.size(); ++k) {
    b.fields["input_ids"][static_cast<int64_t>(k)].narrow(0, 0, samples[k].at("input_ids").size(0)).copy_(
        samples[k].at("input_ids"));
    lengths.push_back(samples[k].at("length"));
  }
  b.fields["length"] = torch::stack(lengths);
  return b;
}
}  // namespace

// A loader of named tensors with a collate function, prepared on 2 ranks: each rank gets its
// shard of the global order, the last round is padded (even_batches) and gather_for_metrics
// returns every sample once, in order; skip_first_batches and a loader's saved position resume
// where they should; dispatch_batches, which broadcasts input and target only, is refused.
TEST(NamedBatches, AreShardedPaddedGatheredSkippedAndResumedOnTwoRanks) {
  hasten::launch(
      [] {
        {
        Accelerator acc;
        auto loader = acc.prepare(hasten::DataLoader(Tokens{}, {.batch_size = 2, .shuffle = true, .seed = 4,
                                                              .num_workers = 2, .collate = pad}));
        Lists mine;
        std::vector<int64_t> gathered;
        for (auto& b : loader) {
          mine.push_back(to_vector(b.indices));
          for (int64_t k = 0; k < b.size(); ++k) {
            const int64_t i = b.indices[k].item<int64_t>();
            require(b["length"][k].item<int64_t>() == i % 3 + 1 && b["input_ids"][k][0].item<int64_t>() == i,
                    "sample " + std::to_string(i) + " is in its row");
          }
          // Each rank pads to its own longest: gather a column every rank has (or pad_across_processes).
          for (auto i : to_vector(acc.gather_for_metrics(b["input_ids"].select(1, 0).contiguous()))) gathered.push_back(i);
        }
        // 11 samples, 2 per rank per round: 3 rounds, the last one padded by one sample.
        require(mine.size() == 3 && loader.size() == 3, "3 batches on each rank, got " + str(mine));
        std::vector<int64_t> sorted = gathered;
        std::sort(sorted.begin(), sorted.end());
        require(sorted == to_vector(torch::arange(11)), "gather_for_metrics: every sample once, got " + str(gathered));
        // The same epoch again, skipping one batch: the rest of this rank's batches.
        loader.set_epoch(0);
        Lists rest;
        for (auto& b : hasten::skip_first_batches(loader, 1)) rest.push_back(to_vector(b.indices));
        require(rest == Lists(mine.begin() + 1, mine.end()), "skip_first_batches: " + str(rest) + " vs " + str(mine));
        // A position saved after the first batch resumes at the second.
        loader.set_epoch(0);
        hasten::LoaderState saved;
        for (auto& b : loader) {
          (void)b;
          saved = loader.state_dict();
          break;
        }
        loader.load_state_dict(saved);
        Lists resumed;
        for (auto& b : loader) resumed.push_back(to_vector(b.indices));
        require(resumed == Lists(mine.begin() + 1, mine.end()), "resumed: " + str(resumed));
        }
        hasten::Options o;
        o.dispatch_batches = true;
        Accelerator central(o);
        auto dispatched = central.prepare(hasten::DataLoader(Tokens{}, {.batch_size = 2, .collate = pad}));
        try {
          for (auto& b : dispatched) (void)b;
          require(false, "dispatch_batches with a collate function was accepted");
        } catch (const hasten::UsageError& e) {
          require(std::string(e.what()).find("set dispatch_batches false for it") != std::string::npos, e.what());
        }
      },
      with_ranks(2));
}

}  // namespace dispatch_tests
