// Samplers and batch samplers for hasten::DataLoader (PyTorch's `sampler=` and
// `batch_sampler=`): what order an epoch visits the dataset in, or which batches it has.
//
// A prepared loader shards them across ranks exactly as Accelerate does: a sampler's indices
// are cut into batches and rounds like hasten's own order (BatchSamplerShard over PyTorch's
// BatchSampler), a batch sampler's batches are dealt to the ranks in turn (BatchSamplerShard,
// with split_batches and even_batches). Every rank must therefore see the same sequence for
// the same epoch: derive randomness from a seed and the epoch, as RandomSampler does
// (Accelerate's SeedableRandomSampler), never from a per-process generator.
//
//   auto sampler = std::make_shared<hasten::RandomSampler>(dataset.size(), /*seed=*/42);
//   hasten::DataLoader loader(dataset, {.batch_size = 8, .sampler = sampler});
//
//   auto batches = std::make_shared<hasten::SamplerBatches>(sampler, 8, /*drop_last=*/false);
//   hasten::DataLoader loader(dataset, {.batch_sampler = batches});
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace hasten {

// The dataset indices one epoch visits, in order (repeats and subsets allowed).
class Sampler {
 public:
  virtual ~Sampler() = default;
  // Indices per epoch (len(sampler)); indices(e) must return this many.
  virtual int64_t size() const = 0;
  // The order of epoch `epoch`; the same on every rank.
  virtual std::vector<int64_t> indices(int64_t epoch) const = 0;
};

// 0, 1, ..., n-1 every epoch (PyTorch's SequentialSampler).
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);
  int64_t size() const override { return n_; }
  std::vector<int64_t> indices(int64_t epoch) const override;

 private:
  int64_t n_;
};

// A random order seeded with seed + epoch, so every rank draws the same one and each epoch a
// new one (Accelerate's SeedableRandomSampler). Without replacement, a permutation of [0, n)
// (torch::randperm with that seed: the order a shuffled hasten::DataLoader with the same seed
// has); with replacement, num_samples draws from [0, n).
class RandomSampler : public Sampler {
 public:
  explicit RandomSampler(int64_t n, uint64_t seed = 0, bool replacement = false,
                         std::optional<int64_t> num_samples = std::nullopt);
  int64_t size() const override { return num_samples_; }
  std::vector<int64_t> indices(int64_t epoch) const override;
  uint64_t seed() const { return seed_; }

 private:
  int64_t n_;
  uint64_t seed_;
  bool replacement_;
  int64_t num_samples_;
};

// The batches of one epoch, each a list of dataset indices.
class BatchSampler {
 public:
  virtual ~BatchSampler() = default;
  virtual std::vector<std::vector<int64_t>> batches(int64_t epoch) const = 0;
  // The batch size all full batches have, or none when sizes vary (Accelerate reads the
  // attribute `batch_size`). With one, a round of batches is only dealt out when its last
  // batch is full; split_batches needs one.
  virtual std::optional<int64_t> batch_size() const { return std::nullopt; }
  // Whether an incomplete round is dropped rather than completed (the attribute `drop_last`).
  virtual bool drop_last() const { return false; }
};

// A sampler's indices in batches of batch_size (PyTorch's BatchSampler(sampler, batch_size,
// drop_last)): the last batch short unless drop_last.
class SamplerBatches : public BatchSampler {
 public:
  SamplerBatches(std::shared_ptr<const Sampler> sampler, int64_t batch_size, bool drop_last = false);
  std::vector<std::vector<int64_t>> batches(int64_t epoch) const override;
  std::optional<int64_t> batch_size() const override { return batch_size_; }
  bool drop_last() const override { return drop_last_; }

 private:
  std::shared_ptr<const Sampler> sampler_;
  int64_t batch_size_;
  bool drop_last_;
};

// The same fixed list of batches every epoch (a Python list of lists given as batch_sampler);
// sizes may vary unless batch_size is given.
class ListBatchSampler : public BatchSampler {
 public:
  explicit ListBatchSampler(std::vector<std::vector<int64_t>> batches,
                            std::optional<int64_t> batch_size = std::nullopt, bool drop_last = false);
  std::vector<std::vector<int64_t>> batches(int64_t) const override { return batches_; }
  std::optional<int64_t> batch_size() const override { return batch_size_; }
  bool drop_last() const override { return drop_last_; }

 private:
  std::vector<std::vector<int64_t>> batches_;
  std::optional<int64_t> batch_size_;
  bool drop_last_;
};

namespace detail {

// One rank's batch of a sharded batch sampler: dataset indices, the trailing ones padding.
struct ShardedBatch {
  std::vector<int64_t> indices;
  int64_t num_padding = 0;
};

// Accelerate's BatchSamplerShard: rank `rank` of `world`'s batches out of one epoch's
// `batches`. Throws hasten::Error for split_batches without a batch size divisible by world.
std::vector<ShardedBatch> shard_batches(const std::vector<std::vector<int64_t>>& batches,
                                        std::optional<int64_t> batch_size, bool drop_last, int64_t world,
                                        int64_t rank, bool split_batches, bool even_batches);

}  // namespace detail
}  // namespace hasten
