// Data loading: epoch plans (one global order, sharded by rank), batch fetching, collation.
#include <hasten/data.hpp>
#include <hasten/error.hpp>
#include <hasten/logging.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <string>

namespace hasten {

namespace {

torch::Tensor real_mask_of(int64_t n, int64_t num_padding) {
  auto mask = torch::ones({n}, torch::kBool);
  if (num_padding > 0) mask.narrow(0, n - num_padding, num_padding).fill_(false);
  return mask;
}

// To a GPU without a host wait: a pageable host tensor is first copied into pinned memory
// (LibTorch's caching host allocator keeps it until the copy has run), then copied on the
// current stream, which the model's kernels that read it follow.
torch::Tensor moved(const torch::Tensor& t, const torch::Device& device, bool non_blocking) {
  if (!t.defined()) return t;
  if (non_blocking && device.is_cuda() && t.is_cpu() && !t.is_pinned()) return t.pin_memory().to(device, true);
  return t.to(device, non_blocking);
}

}  // namespace

torch::Tensor Batch::real_mask() const { return real_mask_of(size(), num_padding); }

Batch Batch::to(const torch::Device& device, bool non_blocking) const {
  Batch b = *this;
  b.input = moved(b.input, device, non_blocking);
  b.target = moved(b.target, device, non_blocking);
  for (auto& [name, t] : b.fields) t = moved(t, device, non_blocking);
  return b;
}

int64_t Batch::size() const {
  if (indices.defined()) return indices.size(0);
  if (input.defined()) return input.size(0);
  return fields.empty() ? 0 : fields.begin()->second.size(0);
}

const torch::Tensor& Batch::operator[](const std::string& name) const {
  const auto it = fields.find(name);
  if (it != fields.end()) return it->second;
  std::string names;
  for (const auto& [key, t] : fields) names += (names.empty() ? "'" : ", '") + key + "'";
  throw UsageError("Batch: no field '" + name + "' (" + (names.empty() ? std::string("it has no named fields") : "it has " + names) + ")");
}

namespace {
torch::Tensor pinned(const torch::Tensor& t) { return t.defined() && !t.is_pinned() ? t.pin_memory() : t; }
}  // namespace

namespace detail {

void warn_pin_memory_unused() {
  static std::once_flag once;
  std::call_once(once, [] {
    get_logger("hasten", false)
        ->warn("DataLoader: pin_memory is set and batches stay on the CPU: page-locked memory only speeds up copies to "
               "a CUDA device, so it is not used");
  });
}

std::string describe_exception(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace detail

Batch Batch::pin_memory() const {
  Batch b = *this;
  b.input = pinned(b.input);
  b.target = pinned(b.target);
  for (auto& [name, t] : b.fields) t = pinned(t);
  return b;
}

ExampleBatch ExampleBatch::pin_memory() const {
  ExampleBatch b = *this;
  b.data = pinned(b.data);
  b.target = pinned(b.target);
  return b;
}

torch::Tensor ExampleBatch::real_mask() const { return real_mask_of(size(), num_padding); }

ExampleBatch ExampleBatch::to(const torch::Device& device, bool non_blocking) const {
  ExampleBatch b = *this;
  b.data = moved(b.data, device, non_blocking);
  b.target = moved(b.target, device, non_blocking);
  return b;
}

TensorDataset::TensorDataset(torch::Tensor inputs, torch::Tensor targets)
    : inputs_(std::move(inputs)), targets_(std::move(targets)) {
  if (!inputs_.defined() || inputs_.dim() == 0)
    throw Error("TensorDataset: inputs must be a tensor with a sample dimension");
  if (targets_.defined() && targets_.size(0) != inputs_.size(0))
    throw Error("TensorDataset: inputs have " + std::to_string(inputs_.size(0)) +
                " samples but targets have " + std::to_string(targets_.size(0)));
}

Batch TensorDataset::get_batch(const std::vector<int64_t>& indices) const {
  Batch b;
  const int64_t n = static_cast<int64_t>(indices.size());
  bool consecutive = n > 0;
  for (int64_t i = 1; i < n && consecutive; ++i) consecutive = indices[i] == indices[0] + i;
  if (consecutive) {  // a view, no copy: what a hand-written loop's narrow() does
    b.input = inputs_.narrow(0, indices[0], n);
    if (targets_.defined()) b.target = targets_.narrow(0, indices[0], n);
  } else {
    auto idx = torch::tensor(indices, torch::kLong);
    b.input = inputs_.index_select(0, idx);
    if (targets_.defined()) b.target = targets_.index_select(0, idx);
  }
  b.indices = torch::tensor(indices, torch::kLong);
  return b;
}

namespace detail {

namespace {

struct Shape {
  int64_t batch = 0;   // per rank
  int64_t round = 0;   // samples per round, all ranks
  int64_t batches = 0; // this rank's per epoch
  bool pad = false;
};

// PyTorch's rules for sampler and batch_sampler, in one line each.
void check_samplers(const DataLoaderOptions& o) {
  if (o.batch_sampler && (o.batch_size != 1 || o.shuffle || o.sampler || o.drop_last))
    throw UsageError("DataLoader: batch_sampler decides the batches; leave batch_size (1), shuffle, sampler and "
                     "drop_last unset (as PyTorch's DataLoader requires)");
  if (o.sampler && o.shuffle)
    throw UsageError("DataLoader: sampler and shuffle exclude each other; for a shuffled order use "
                     "hasten::RandomSampler(n, seed)");
}

// The positions one epoch has: the sampler's indices, or the dataset.
int64_t epoch_length(const ShardSpec& spec) {
  return spec.options.sampler ? spec.options.sampler->size() : spec.dataset_size;
}

// The worker options: checked wherever a plan is made.
void check_workers(const DataLoaderOptions& o) {
  if (o.num_workers < 0 || o.num_workers > 256)
    throw UsageError("DataLoader: num_workers must be from 0 to 256, got " + std::to_string(o.num_workers));
  if (o.prefetch_factor && o.num_workers == 0)
    throw UsageError("DataLoader: prefetch_factor is the batches each worker fetches ahead; it needs num_workers > 0 "
                     "(PyTorch's rule too)");
  if (o.prefetch_factor && (*o.prefetch_factor < 1 || *o.prefetch_factor > 1024))
    throw UsageError("DataLoader: prefetch_factor must be from 1 to 1024, got " + std::to_string(*o.prefetch_factor));
}

Shape shape_of(const ShardSpec& spec) {
  const auto& o = spec.options;
  check_samplers(o);
  check_workers(o);
  if (o.batch_size < 1)
    throw Error("DataLoader: batch_size must be >= 1, got " + std::to_string(o.batch_size));
  if (spec.world_size < 1 || spec.rank < 0 || spec.rank >= spec.world_size)
    throw Error("DataLoader: rank " + std::to_string(spec.rank) + " outside world of " +
                std::to_string(spec.world_size));
  Shape s;
  const int64_t n = epoch_length(spec), w = spec.world_size;
  if (spec.split_batches) {
    if (o.batch_size % w != 0)
      throw Error("DataLoader: split_batches needs a batch_size divisible by the " +
                  std::to_string(w) + " processes, got " + std::to_string(o.batch_size));
    s.batch = o.batch_size / w;
  } else {
    s.batch = o.batch_size;
  }
  s.round = s.batch * w;
  if (n == 0) return s;
  if (o.drop_last) {
    s.batches = n / s.round;
  } else if (w == 1) {
    s.batches = (n + s.batch - 1) / s.batch;  // a short last batch, nothing to pad
  } else if (spec.even_batches) {
    s.batches = (n + s.round - 1) / s.round;  // the last round is completed by wrapping
    s.pad = true;
  } else {
    // Only real samples: rank r gets the batches that start before the end.
    const int64_t full = n / s.round, rest = n % s.round;
    s.batches = full + (rest > spec.rank * s.batch ? 1 : 0);
  }
  return s;
}

}  // namespace

namespace {

void check_index(int64_t i, const ShardSpec& spec, const char* source) {
  if (i < 0 || i >= spec.dataset_size)
    throw Error(std::string("DataLoader: the ") + source + " gave index " + std::to_string(i) + " for a dataset of " +
                std::to_string(spec.dataset_size) + " samples (allowed: 0 to " + std::to_string(spec.dataset_size - 1) +
                ")");
}

// A batch sampler's epoch: its batches dealt to the ranks (Accelerate's BatchSamplerShard).
EpochPlan batch_sampler_plan(const ShardSpec& spec, int64_t epoch) {
  check_samplers(spec.options);
  const BatchSampler& sampler = *spec.options.batch_sampler;
  const auto all = sampler.batches(epoch);
  for (const auto& b : all)
    for (auto i : b) check_index(i, spec, "batch sampler");
  const auto size = sampler.batch_size();
  EpochPlan plan;
  plan.world_size = spec.world_size;
  plan.rank = spec.rank;
  plan.batch_size = size.value_or(0);
  plan.pad = spec.world_size > 1 && spec.even_batches && !sampler.drop_last();
  for (int64_t r = 0; r < spec.world_size; ++r) {
    auto shard = shard_batches(all, size, sampler.drop_last(), spec.world_size, r, spec.split_batches,
                               spec.even_batches);
    int64_t padding = 0, samples = 0;
    for (const auto& b : shard) padding += b.num_padding, samples += static_cast<int64_t>(b.indices.size());
    plan.rank_padding.push_back(padding);
    plan.rank_samples.push_back(samples);
    if (r == spec.rank) {
      plan.num_batches = static_cast<int64_t>(shard.size());
      plan.batches = std::make_shared<const std::vector<ShardedBatch>>(std::move(shard));
    }
  }
  return plan;
}

}  // namespace

DispatchSlice dispatch_slice(int64_t observed, bool last, bool drop_last, int64_t world, int64_t rank,
                             int64_t first_rows) {
  DispatchSlice s;
  int64_t rows = observed, per_rank = observed / world;
  if (last && !drop_last && observed % world != 0) {  // Accelerate adds the first batch's rows
    rows += first_rows;
    per_rank += 1;
  }
  s.begin = std::min(rank * per_rank, rows);
  s.end = std::min((rank + 1) * per_rank, rows);
  s.padding = std::max<int64_t>(0, s.end - std::max(s.begin, observed));
  return s;
}

namespace {

// The one-process loader a dispatching loader's rank 0 reads: the options as the user gave
// them (split_batches and even_batches do not apply to it).
ShardSpec base_spec(const ShardSpec& spec) {
  ShardSpec base = spec;
  base.world_size = 1;
  base.rank = 0;
  base.split_batches = false;
  base.even_batches = true;
  base.dispatch_batches = false;
  return base;
}

// Rounds of a dispatched epoch over `base_batches` base batches (DataLoaderDispatcher's __len__).
int64_t dispatch_rounds(const ShardSpec& spec, int64_t base_batches) {
  if (spec.split_batches) return base_batches;
  const int64_t w = spec.world_size;
  return spec.options.drop_last ? base_batches / w : (base_batches + w - 1) / w;
}

// The spec's own checks (split_batches needs a batch size the processes divide, dispatched
// or not; a batch sampler's batches are sliced as they come, as in Accelerate).
void check_dispatch(const ShardSpec& spec) {
  if (spec.options.batch_sampler)
    check_samplers(spec.options);
  else
    shape_of(spec);
}

// A dispatched map-style epoch: the base plan, and every rank's samples and padding (the
// slices of each round), so that gather_for_metrics after the loop drops the padding.
EpochPlan dispatch_plan(const ShardSpec& spec, int64_t epoch) {
  check_dispatch(spec);
  auto base = std::make_shared<EpochPlan>(make_epoch_plan(base_spec(spec), epoch));
  EpochPlan plan;
  plan.epoch = epoch;
  plan.dataset_size = base->dataset_size;
  plan.batch_size = spec.options.batch_size;
  plan.world_size = spec.world_size;
  plan.rank = spec.rank;
  plan.dispatch = true;
  plan.split = spec.split_batches;
  // The user loader's drop_last (a batch sampler's own drops only inside it, as in Accelerate).
  plan.drop_last = spec.options.drop_last;
  plan.num_batches = dispatch_rounds(spec, base->num_batches);
  auto base_size = [&](int64_t k) -> int64_t {
    if (base->batches) return static_cast<int64_t>((*base->batches)[static_cast<size_t>(k)].indices.size());
    return std::min(base->batch_size, base->dataset_size - k * base->batch_size);
  };
  const int64_t per_round = spec.split_batches ? 1 : spec.world_size;
  plan.rank_samples.assign(static_cast<size_t>(spec.world_size), 0);
  plan.rank_padding.assign(static_cast<size_t>(spec.world_size), 0);
  int64_t first_rows = 0;
  for (int64_t b = 0; b < plan.num_batches; ++b) {
    int64_t observed = 0;
    for (int64_t k = b * per_round; k < std::min((b + 1) * per_round, base->num_batches); ++k) observed += base_size(k);
    if (b == 0) first_rows = std::min(observed, spec.world_size);
    const bool last = b + 1 == plan.num_batches;
    for (int64_t r = 0; r < spec.world_size; ++r) {
      const DispatchSlice s = dispatch_slice(observed, last, plan.drop_last, spec.world_size, r, first_rows);
      plan.rank_samples[static_cast<size_t>(r)] += s.end - s.begin;
      plan.rank_padding[static_cast<size_t>(r)] += s.padding;
      if (s.padding > 0) plan.pad = true;
    }
  }
  plan.base = std::move(base);
  return plan;
}

}  // namespace

int64_t count_batches(const ShardSpec& spec) {
  if (spec.dispatch_batches) {
    check_dispatch(spec);
    return dispatch_rounds(spec, count_batches(base_spec(spec)));
  }
  if (spec.options.batch_sampler) return batch_sampler_plan(spec, 0).num_batches;
  return shape_of(spec).batches;
}

EpochPlan make_stream_plan(const ShardSpec& spec, int64_t epoch) {
  const auto& o = spec.options;
  check_workers(o);
  if (o.num_workers > 0)
    throw UsageError("DataLoader: num_workers reads batches of a map-style dataset ahead, by their indices; a stream "
                     "dataset is read in order by one thread (set num_workers 0)");
  if (o.shuffle || o.sampler || o.batch_sampler)
    throw UsageError("DataLoader: a stream dataset is read in its own order; shuffle, sampler and batch_sampler "
                     "need a map-style dataset (size() and get_batch or get)");
  if (o.batch_size < 1)
    throw Error("DataLoader: batch_size must be >= 1, got " + std::to_string(o.batch_size));
  if (spec.world_size < 1 || spec.rank < 0 || spec.rank >= spec.world_size)
    throw Error("DataLoader: rank " + std::to_string(spec.rank) + " outside world of " +
                std::to_string(spec.world_size));
  if (spec.split_batches && o.batch_size % spec.world_size != 0)
    throw Error("DataLoader: split_batches needs a batch_size divisible by the " + std::to_string(spec.world_size) +
                " processes, got " + std::to_string(o.batch_size));
  EpochPlan plan;
  plan.dataset_size = -1;  // unknown: the stream ends when it ends
  plan.batch_size = spec.split_batches ? o.batch_size / spec.world_size : o.batch_size;
  plan.world_size = spec.world_size;
  plan.rank = spec.rank;
  plan.num_batches = std::numeric_limits<int64_t>::max();
  plan.epoch = epoch;
  if (spec.dispatch_batches) {  // rank 0 reads batch_size samples at a time, as one process
    plan.dispatch = true;
    plan.split = spec.split_batches;
    plan.drop_last = o.drop_last;
    plan.batch_size = o.batch_size;
  }
  return plan;
}

EpochPlan make_epoch_plan(const ShardSpec& spec, int64_t epoch) {
  check_workers(spec.options);
  if (spec.dispatch_batches && spec.options.num_workers > 0)
    throw UsageError("DataLoader: num_workers with dispatch_batches is not supported (rank 0 reads every rank's "
                     "batches on the training thread); set dispatch_batches false or num_workers 0");
  if (spec.dispatch_batches) return dispatch_plan(spec, epoch);
  if (spec.options.batch_sampler) {
    EpochPlan plan = batch_sampler_plan(spec, epoch);
    plan.epoch = epoch;
    return plan;
  }
  const Shape s = shape_of(spec);
  EpochPlan plan;
  plan.epoch = epoch;
  plan.dataset_size = epoch_length(spec);
  plan.batch_size = s.batch;
  plan.world_size = spec.world_size;
  plan.rank = spec.rank;
  plan.num_batches = s.batches;
  plan.pad = s.pad;
  if (const auto& sampler = spec.options.sampler) {
    // The sampler's order for this epoch, sharded as hasten's own order would be.
    auto order = std::make_shared<std::vector<int64_t>>(sampler->indices(epoch));
    if (static_cast<int64_t>(order->size()) != plan.dataset_size)
      throw Error("DataLoader: the sampler gave " + std::to_string(order->size()) + " indices for epoch " +
                  std::to_string(epoch) + " but its size() is " + std::to_string(plan.dataset_size));
    for (auto i : *order) check_index(i, spec, "sampler");
    plan.order = std::move(order);
    return plan;
  }
  auto order = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(spec.dataset_size));
  if (spec.options.shuffle) {
    // The same seed on every rank: one global order per epoch.
    auto gen = at::make_generator<at::CPUGeneratorImpl>(spec.options.seed + static_cast<uint64_t>(epoch));
    auto perm = torch::randperm(spec.dataset_size, gen, torch::kLong);
    std::memcpy(order->data(), perm.data_ptr<int64_t>(), order->size() * sizeof(int64_t));
  } else {
    for (int64_t i = 0; i < spec.dataset_size; ++i) (*order)[static_cast<size_t>(i)] = i;
  }
  plan.order = std::move(order);
  return plan;
}

std::vector<int64_t> EpochPlan::batch(int64_t b, int64_t* num_padding) const {
  if (b < 0 || b >= num_batches) throw Error("DataLoader: batch index out of range");
  if (batches) {
    const ShardedBatch& sb = (*batches)[static_cast<size_t>(b)];
    if (num_padding != nullptr) *num_padding = sb.num_padding;
    return sb.indices;
  }
  const int64_t n = dataset_size;
  const int64_t start = (b * world_size + rank) * batch_size;
  int64_t stop = start + batch_size;
  if (!pad) stop = std::min(stop, n);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(stop - start));
  int64_t padding = 0;
  for (int64_t p = start; p < stop; ++p) {
    if (p >= n) ++padding;
    out.push_back((*order)[static_cast<size_t>(p % n)]);
  }
  if (num_padding != nullptr) *num_padding = padding;
  return out;
}

}  // namespace detail
}  // namespace hasten
