// Samplers and batch samplers, and the sharding of a batch sampler's batches across ranks
// (Accelerate's BatchSamplerShard, step for step, with the padding counted).
#include <hasten/error.hpp>
#include <hasten/samplers.hpp>

#include <torch/torch.h>

#include <string>

namespace hasten {

namespace {

int64_t checked_count(int64_t n, const char* what) {
  if (n < 0) throw UsageError(std::string(what) + ": the number of samples must be >= 0, got " + std::to_string(n));
  return n;
}

std::vector<int64_t> to_vector(const torch::Tensor& t) {
  const auto* p = t.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + t.numel());
}

}  // namespace

SequentialSampler::SequentialSampler(int64_t n) : n_(checked_count(n, "SequentialSampler")) {}

std::vector<int64_t> SequentialSampler::indices(int64_t) const {
  std::vector<int64_t> out(static_cast<size_t>(n_));
  for (int64_t i = 0; i < n_; ++i) out[static_cast<size_t>(i)] = i;
  return out;
}

RandomSampler::RandomSampler(int64_t n, uint64_t seed, bool replacement, std::optional<int64_t> num_samples)
    : n_(checked_count(n, "RandomSampler")), seed_(seed), replacement_(replacement), num_samples_(num_samples.value_or(n)) {
  if (num_samples_ < 0)
    throw UsageError("RandomSampler: num_samples must be >= 0, got " + std::to_string(num_samples_));
  if (n_ == 0 && num_samples_ > 0)
    throw UsageError("RandomSampler: cannot draw " + std::to_string(num_samples_) + " samples from an empty dataset");
}

std::vector<int64_t> RandomSampler::indices(int64_t epoch) const {
  // The seed of the epoch, as SeedableRandomSampler does: the same on every rank.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed_ + static_cast<uint64_t>(epoch));
  if (replacement_) return to_vector(torch::randint(n_, {num_samples_}, gen, torch::kLong));
  // Without replacement, PyTorch's RandomSampler: whole permutations, then part of one more.
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(num_samples_));
  for (int64_t k = 0; k < num_samples_ / std::max<int64_t>(n_, 1); ++k) {
    auto perm = to_vector(torch::randperm(n_, gen, torch::kLong));
    out.insert(out.end(), perm.begin(), perm.end());
  }
  if (const int64_t rest = n_ == 0 ? 0 : num_samples_ % n_; rest > 0) {
    auto perm = to_vector(torch::randperm(n_, gen, torch::kLong));
    out.insert(out.end(), perm.begin(), perm.begin() + rest);
  }
  return out;
}

SamplerBatches::SamplerBatches(std::shared_ptr<const Sampler> sampler, int64_t batch_size, bool drop_last)
    : sampler_(std::move(sampler)), batch_size_(batch_size), drop_last_(drop_last) {
  if (!sampler_) throw UsageError("SamplerBatches: the sampler is null");
  if (batch_size_ < 1) throw UsageError("SamplerBatches: batch_size must be >= 1, got " + std::to_string(batch_size_));
}

std::vector<std::vector<int64_t>> SamplerBatches::batches(int64_t epoch) const {
  const auto order = sampler_->indices(epoch);
  std::vector<std::vector<int64_t>> out;
  for (size_t i = 0; i < order.size(); i += static_cast<size_t>(batch_size_)) {
    const size_t end = std::min(order.size(), i + static_cast<size_t>(batch_size_));
    if (drop_last_ && end - i < static_cast<size_t>(batch_size_)) break;
    out.emplace_back(order.begin() + static_cast<std::ptrdiff_t>(i), order.begin() + static_cast<std::ptrdiff_t>(end));
  }
  return out;
}

ListBatchSampler::ListBatchSampler(std::vector<std::vector<int64_t>> batches, std::optional<int64_t> batch_size,
                                   bool drop_last)
    : batches_(std::move(batches)), batch_size_(batch_size), drop_last_(drop_last) {
  if (batch_size_ && *batch_size_ < 1)
    throw UsageError("ListBatchSampler: batch_size must be >= 1, got " + std::to_string(*batch_size_));
}

namespace detail {

namespace {

using Batches = std::vector<std::vector<int64_t>>;

// Python's batch[a:b] (clamped to the batch), with the count of positions at or past `real`.
ShardedBatch slice(const std::vector<int64_t>& batch, int64_t a, int64_t b, int64_t real) {
  ShardedBatch out;
  const int64_t n = static_cast<int64_t>(batch.size());
  for (int64_t i = std::min(a, n); i < std::min(b, n); ++i) {
    out.indices.push_back(batch[static_cast<size_t>(i)]);
    if (i >= real) ++out.num_padding;
  }
  return out;
}

// BatchSamplerShard._iter_with_split: every full batch is cut into world pieces.
std::vector<ShardedBatch> with_split(const Batches& batches, int64_t batch_size, bool drop_last, int64_t world,
                                     int64_t rank, bool even) {
  std::vector<ShardedBatch> out;
  const int64_t piece = batch_size / world;
  const int64_t a = piece * rank, b = piece * (rank + 1);
  for (const auto& batch : batches)
    if (static_cast<int64_t>(batch.size()) == batch_size) out.push_back(slice(batch, a, b, batch_size));
  if (drop_last || batches.empty() || batches.front().empty()) return out;
  const auto& last = batches.back();
  const int64_t real = static_cast<int64_t>(last.size());
  if (real >= batch_size) return out;
  if (!even) {
    if (real > a) out.push_back(slice(last, a, b, real));
    return out;
  }
  // Complete the short last batch with the first batch, repeated as often as needed.
  std::vector<int64_t> initial = batches.front();
  while (static_cast<int64_t>(initial.size()) < batch_size) {
    const auto copy = initial;
    initial.insert(initial.end(), copy.begin(), copy.end());
  }
  std::vector<int64_t> completed = last;
  completed.insert(completed.end(), initial.begin(), initial.end());
  out.push_back(slice(completed, a, b, real));
  return out;
}

// BatchSamplerShard._iter_with_no_split: batch i goes to rank i % world, a round only once
// its last batch is full; the last round is completed from the epoch's first samples (or
// first batches, when sizes vary).
std::vector<ShardedBatch> without_split(const Batches& batches, std::optional<int64_t> batch_size, bool drop_last,
                                        int64_t world, int64_t rank, bool even) {
  std::vector<ShardedBatch> out;
  std::vector<int64_t> initial;  // the first rounds' indices (fixed batch size)
  Batches initial_batches;       // or their batches (varying sizes)
  std::optional<std::vector<int64_t>> to_yield;
  const auto full = [&](const std::vector<int64_t>& b) {
    return !batch_size || static_cast<int64_t>(b.size()) == *batch_size;
  };
  int64_t idx = -1;
  for (const auto& batch : batches) {
    ++idx;
    if (!drop_last && idx < world) {
      if (batch_size)
        initial.insert(initial.end(), batch.begin(), batch.end());
      else
        initial_batches.push_back(batch);
    }
    if (idx % world == rank) to_yield = batch;
    if (idx % world == world - 1 && full(batch)) {
      if (to_yield) out.push_back({*to_yield, 0});
      to_yield.reset();
    }
  }
  const bool have_initial = batch_size ? !initial.empty() : !initial_batches.empty();
  if (drop_last || !have_initial) return out;
  if (!even) {
    if (to_yield && !to_yield->empty()) out.push_back({*to_yield, 0});
    return out;
  }
  if (to_yield && !to_yield->empty() && full(*to_yield)) out.push_back({*to_yield, 0});
  // Degenerate epochs (fewer samples than one round): repeat the start until it suffices.
  if (batch_size) {
    while (static_cast<int64_t>(initial.size()) < world * *batch_size) {
      const auto copy = initial;
      initial.insert(initial.end(), copy.begin(), copy.end());
    }
  } else {
    while (static_cast<int64_t>(initial_batches.size()) < world) {
      const auto copy = initial_batches;
      initial_batches.insert(initial_batches.end(), copy.begin(), copy.end());
    }
  }
  // The last batch, when full, went to its rank above: completion starts with the next one.
  std::vector<int64_t> batch = batches.back();
  if (full(batch)) {
    batch.clear();
    ++idx;
  }
  size_t cycle = 0;
  while (idx % world != 0 || !batch.empty()) {
    if (!batch_size) {
      if (idx % world == rank) {
        const auto& b = initial_batches[cycle];
        out.push_back({b, static_cast<int64_t>(b.size())});
      }
      ++cycle;
    } else {
      const int64_t real = static_cast<int64_t>(batch.size());
      const size_t end = cycle + static_cast<size_t>(*batch_size - real);
      batch.insert(batch.end(), initial.begin() + static_cast<std::ptrdiff_t>(cycle),
                   initial.begin() + static_cast<std::ptrdiff_t>(std::min(end, initial.size())));
      if (idx % world == rank) out.push_back({batch, static_cast<int64_t>(batch.size()) - real});
      cycle = end;
    }
    batch.clear();
    ++idx;
  }
  return out;
}

}  // namespace

std::vector<ShardedBatch> shard_batches(const Batches& batches, std::optional<int64_t> batch_size, bool drop_last,
                                        int64_t world, int64_t rank, bool split_batches, bool even_batches) {
  if (world < 1 || rank < 0 || rank >= world)
    throw Error("DataLoader: rank " + std::to_string(rank) + " outside world of " + std::to_string(world));
  if (split_batches && (!batch_size || *batch_size % world != 0))
    throw Error("DataLoader: split_batches needs a batch sampler with a fixed batch_size() divisible by the " +
                std::to_string(world) + " processes, got " +
                (batch_size ? std::to_string(*batch_size) : std::string("none (varying sizes)")));
  if (world == 1) {  // one process: the batches as they are (Accelerate does not wrap them)
    std::vector<ShardedBatch> out;
    out.reserve(batches.size());
    for (const auto& b : batches) out.push_back({b, 0});
    return out;
  }
  return split_batches ? with_split(batches, *batch_size, drop_last, world, rank, even_batches)
                       : without_split(batches, batch_size, drop_last, world, rank, even_batches);
}

}  // namespace detail
}  // namespace hasten
