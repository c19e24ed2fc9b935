// hasten's data loader for map-style datasets.
//
// A dataset is either hasten-style: any type with `size()` (size_t or std::optional<size_t>)
// and either
//   Batch get_batch(const std::vector<int64_t>& indices) const   // fast path, or
//   torch::data::Example<> get(size_t index)                     // collated by stacking,
// or one of LibTorch's map-style datasets: torch::data::datasets::MNIST, a user's
// `struct MyData : torch::data::datasets::Dataset<MyData>`, and their .map(...) with
// transforms such as Normalize<> and Stack<>. LibTorch's are fetched with
// get_batch(ArrayRef<size_t>); a std::vector<Example<>> result is stacked, an Example<>
// (after Stack<>) is used as it is. LibTorch's stateful and stream datasets (ChunkDataset,
// StreamDataset) are refused at compile time: they have no indices to shard. hasten's own
// stream datasets (`std::optional<torch::data::Example<>> next()` and `void reset()`) are read
// by every rank, each keeping its slice of every round (Accelerate's IterableDatasetShard).
// DataLoaderOptions::sampler and ::batch_sampler (samplers.hpp) replace the order or the
// batches of map-style datasets.
// TensorDataset wraps two tensors and slices batches without copying when the indices are
// consecutive.
//
//   hasten::DataLoader loader(hasten::TensorDataset(x, y), {.batch_size = 32, .shuffle = true});
//   auto prepared = acc.prepare(loader);
//   for (auto& batch : prepared) { batch.input; batch.target; }       // hasten::Batch
//
//   using namespace torch::data;
//   hasten::DataLoader mnist(datasets::MNIST(dir).map(transforms::Normalize<>(0.1307, 0.3081))
//                                .map(transforms::Stack<>()), {.batch_size = 64, .shuffle = true});
//   auto batches = acc.prepare(mnist);
//   for (auto& batch : batches) { batch.data; batch.target; }  // hasten::ExampleBatch
//
// Both kinds are sharded, padded and resumed by the same code (detail::EpochPlan); only the
// batch type differs, so that LibTorch code keeps its `data`/`target` names.
// torch::data::make_data_loader's loaders are not accepted: wrap their dataset instead.
//
// A prepared loader gives rank r its share of one global order (the same seed on every rank,
// a new order each epoch: seed + epoch), and tells the Accelerator when it is about to yield
// its last batch, so accumulate() synchronises there.
#pragma once

#include <hasten/error.hpp>
#include <hasten/samplers.hpp>

#include <torch/data/dataloader/base.h>
#include <torch/data/example.h>
#include <torch/types.h>

#include <c10/util/ArrayRef.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace hasten {

// One batch. Samples past `size() - num_padding` repeat earlier samples of the epoch: they
// pad the last round so every process gets the same number of full batches (even_batches),
// and gather_for_metrics drops them.
struct Batch {
  torch::Tensor input;
  torch::Tensor target;
  torch::Tensor indices;  // int64 dataset indices of the samples
  int64_t num_padding = 0;

  int64_t size() const { return indices.defined() ? indices.size(0) : input.size(0); }
  // The non-padding samples, as a boolean mask over dim 0.
  torch::Tensor real_mask() const;
  Batch to(const torch::Device& device, bool non_blocking = false) const;
};

// One batch of a LibTorch dataset: a torch::data::Example<> (so `data` and `target`, as with
// LibTorch's own loaders, and usable where an Example<> is expected) with hasten::Batch's
// bookkeeping. Samples past `size() - num_padding` are padding, as in Batch.
struct ExampleBatch : torch::data::Example<> {
  torch::Tensor indices;  // int64 dataset indices of the samples
  int64_t num_padding = 0;

  int64_t size() const { return indices.defined() ? indices.size(0) : data.size(0); }
  torch::Tensor real_mask() const;
  ExampleBatch to(const torch::Device& device, bool non_blocking = false) const;
};

struct DataLoaderOptions {
  int64_t batch_size = 1;  // per process (the global batch with split_batches)
  bool shuffle = false;
  uint64_t seed = 0;  // shuffle order of epoch e: permutation seeded with seed + e
  bool drop_last = false;
  // Unset: the Accelerator's (config keys even_batches, split_batches); set: this loader's own.
  std::optional<bool> even_batches = std::nullopt;
  std::optional<bool> split_batches = std::nullopt;
  // Accelerate's dispatch_batches: only rank 0 reads the loader and broadcasts each round, which
  // every rank slices (prepared_data_loader.hpp). Unset: the Accelerator's (config key
  // dispatch_batches), whose own unset means on for stream datasets and off for map-style ones.
  std::optional<bool> dispatch_batches = std::nullopt;
  // A user sampler instead of shuffle/seed: the order of each epoch (samplers.hpp); batched
  // by batch_size and sharded like hasten's own order. Not with shuffle.
  std::shared_ptr<const Sampler> sampler = nullptr;
  // A user batch sampler: the batches of each epoch, dealt to the ranks like Accelerate's
  // BatchSamplerShard. Not with batch_size, shuffle, sampler or drop_last (it decides them).
  std::shared_ptr<const BatchSampler> batch_sampler = nullptr;
};

// A prepared loader's position (PreparedDataLoader::state_dict): the epoch its next iteration
// begins and the batch of that epoch it begins at. Taken mid-epoch, the batch after the one
// yielded last.
struct LoaderState {
  int64_t epoch = 0;
  int64_t next_batch = 0;
  bool operator==(const LoaderState& o) const { return epoch == o.epoch && next_batch == o.next_batch; }
};

// Two tensors whose first dimensions index samples.
class TensorDataset {
 public:
  TensorDataset(torch::Tensor inputs, torch::Tensor targets);
  size_t size() const { return static_cast<size_t>(inputs_.size(0)); }
  Batch get_batch(const std::vector<int64_t>& indices) const;
  const torch::Tensor& inputs() const { return inputs_; }
  const torch::Tensor& targets() const { return targets_; }

 private:
  torch::Tensor inputs_;
  torch::Tensor targets_;
};

namespace detail {

// The batches of one epoch for one rank: which positions of the epoch's global order each
// batch holds. Positions at or past the dataset size wrap around (padding).
struct EpochPlan {
  std::shared_ptr<const std::vector<int64_t>> order;  // dataset indices in the epoch's order
  int64_t dataset_size = 0;  // positions in `order` (the dataset's size, or the sampler's)
  int64_t batch_size = 0;  // per rank
  int64_t world_size = 1;
  int64_t rank = 0;
  int64_t num_batches = 0;  // this rank's
  bool pad = false;         // complete short rounds by wrapping around
  int64_t first_batch = 0;  // where iteration starts (after load_state: mid-epoch)
  // A batch sampler's epoch: this rank's batches as they are (instead of positions of
  // `order`), and every rank's padding and samples in all (gather_for_metrics after it).
  std::shared_ptr<const std::vector<ShardedBatch>> batches;
  std::vector<int64_t> rank_padding, rank_samples;
  int64_t epoch = 0;  // the epoch planned (a stream dataset's set_epoch)
  // dispatch_batches (Accelerate's DataLoaderDispatcher): rank 0 reads the base loader, the
  // loader the user built, as one process would (`base`: its plan; none for a stream, read
  // `batch_size` samples at a time), and broadcasts a round (N of its batches, one with
  // `split`) that every rank slices; num_batches and first_batch count rounds.
  bool dispatch = false;
  bool split = false;
  bool drop_last = false;  // the base loader's: short base batches and short rounds are dropped
  std::shared_ptr<const EpochPlan> base;

  // The dataset indices of batch b and how many of them (at the end) are padding.
  std::vector<int64_t> batch(int64_t b, int64_t* num_padding) const;
};

struct ShardSpec {
  int64_t dataset_size = 0;
  DataLoaderOptions options;
  int64_t world_size = 1;
  int64_t rank = 0;
  bool even_batches = true;
  bool split_batches = false;
  bool dispatch_batches = false;  // resolved; only with more than one process
};

// Rank `rank`'s rows of one dispatched round (Accelerate's DataLoaderDispatcher): the round
// has `observed` samples; the last one, when they do not divide by the world and drop_last is
// off, is followed by `first_rows` samples from the epoch's first round and every rank gets
// one more row (Python's slice bounds: a rank past the rows gets fewer, possibly none).
struct DispatchSlice {
  int64_t begin = 0, end = 0;  // rows of the (completed) round
  int64_t padding = 0;         // of them, rows past `observed`
};
DispatchSlice dispatch_slice(int64_t observed, bool last, bool drop_last, int64_t world, int64_t rank,
                             int64_t first_rows);

// Throws hasten::Error on impossible specs (batch size 0, split_batches with a batch size
// not divisible by the world size).
EpochPlan make_epoch_plan(const ShardSpec& spec, int64_t epoch);
// This rank's number of batches per epoch under spec (no order is built).
int64_t count_batches(const ShardSpec& spec);

template <class T, class = void>
struct has_get_batch : std::false_type {};
template <class T>
struct has_get_batch<T, std::void_t<decltype(std::declval<const T&>().get_batch(
                            std::declval<const std::vector<int64_t>&>()))>> : std::true_type {};
template <class T, class = void>
struct has_get : std::false_type {};
template <class T>
struct has_get<T, std::void_t<decltype(std::declval<T&>().get(size_t{}))>> : std::true_type {};
template <class T, class = void>
struct has_size : std::false_type {};
template <class T>
struct has_size<T, std::void_t<decltype(std::declval<const T&>().size())>> : std::true_type {};

// LibTorch's datasets (torch::data::datasets::BatchDataset and everything derived from it,
// .map() results included) name their batch and request types and say whether they are
// stateful; hasten-style datasets do not.
template <class T, class = void>
struct is_torch_dataset : std::false_type {};
template <class T>
struct is_torch_dataset<T, std::void_t<typename T::BatchType, typename T::BatchRequestType,
                                       decltype(T::is_stateful)>> : std::true_type {};
template <class T>
constexpr bool is_torch_dataset_v = is_torch_dataset<T>::value;

// Map-style: not stateful (a stateful one's BatchType is an optional: ChunkDataset) and
// indexed by positions (a StreamDataset's request is a count).
template <class T, bool = is_torch_dataset_v<T>>
struct is_torch_map_dataset : std::false_type {};
template <class T>
struct is_torch_map_dataset<T, true>
    : std::bool_constant<!T::is_stateful &&
                         std::is_constructible_v<typename T::BatchRequestType, c10::ArrayRef<size_t>>> {};

// LibTorch's data loaders (what torch::data::make_data_loader returns, behind its pointer).
template <class D, class B, class R>
std::true_type derives_from_torch_loader(const torch::data::DataLoaderBase<D, B, R>*);
std::false_type derives_from_torch_loader(const void*);
template <class T>
struct is_torch_loader : decltype(derives_from_torch_loader(std::declval<const T*>())) {};
template <class T>
struct is_torch_loader<std::unique_ptr<T>> : is_torch_loader<T> {};
template <class T>
struct is_torch_loader<std::shared_ptr<T>> : is_torch_loader<T> {};
template <class T>
constexpr bool is_torch_loader_v = is_torch_loader<std::decay_t<T>>::value;

template <class T>
constexpr bool is_hasten_dataset_v =
    !is_torch_dataset_v<T> && has_size<T>::value && (has_get_batch<T>::value || has_get<T>::value);

// A stream (iterable) dataset: next() gives the next sample or none at the end, reset()
// starts the stream over; set_epoch(int64_t), if it has one, is told each epoch first.
template <class T, class = void>
struct has_next : std::false_type {};
template <class T>
struct has_next<T, std::void_t<decltype(std::declval<T&>().next())>>
    : std::is_convertible<decltype(std::declval<T&>().next()), std::optional<torch::data::Example<>>> {};
template <class T, class = void>
struct has_reset : std::false_type {};
template <class T>
struct has_reset<T, std::void_t<decltype(std::declval<T&>().reset())>> : std::true_type {};
template <class T, class = void>
struct has_set_epoch : std::false_type {};
template <class T>
struct has_set_epoch<T, std::void_t<decltype(std::declval<T&>().set_epoch(int64_t{}))>> : std::true_type {};
template <class T>
constexpr bool is_stream_dataset_v =
    !is_torch_dataset_v<T> && !is_hasten_dataset_v<T> && has_next<T>::value && has_reset<T>::value;

// What hasten::DataLoader can load (it refuses the rest with a static_assert).
template <class T>
constexpr bool is_loadable_v = is_torch_map_dataset<T>::value || is_hasten_dataset_v<T> || is_stream_dataset_v<T>;

// The batch a loader over Dataset yields: LibTorch's datasets keep LibTorch's names.
template <class Dataset>
using batch_t = std::conditional_t<is_torch_dataset_v<Dataset>, ExampleBatch, Batch>;

template <class T>
size_t dataset_size(const T& dataset) {
  if constexpr (std::is_convertible_v<decltype(dataset.size()), size_t>) {
    return dataset.size();
  } else {
    auto n = dataset.size();
    if (!n) throw UsageError("hasten::DataLoader needs a dataset with a known size (its size() returned no value)");
    return *n;
  }
}

// Stacks examples into a batch.
Batch collate(std::vector<torch::data::Example<>> examples, const std::vector<int64_t>& indices);
ExampleBatch collate_examples(std::vector<torch::data::Example<>> examples,
                              const std::vector<int64_t>& indices);
// A batch already stacked (by Stack<> or the dataset's own get_batch).
ExampleBatch example_batch(torch::data::Example<> stacked, const std::vector<int64_t>& indices);

template <class Dataset>
batch_t<Dataset> fetch(Dataset& dataset, const std::vector<int64_t>& indices) {
  if constexpr (is_torch_map_dataset<Dataset>::value) {
    const std::vector<size_t> request(indices.begin(), indices.end());  // LibTorch's index type
    auto out = dataset.get_batch(c10::ArrayRef<size_t>(request));
    using Out = decltype(out);
    if constexpr (std::is_same_v<Out, std::vector<torch::data::Example<>>>) {
      return collate_examples(std::move(out), indices);
    } else {
      static_assert(std::is_same_v<Out, torch::data::Example<>>,
                    "hasten::DataLoader: a LibTorch dataset's get_batch must return "
                    "std::vector<torch::data::Example<>> or, stacked (.map(torch::data::transforms::Stack<>())), "
                    "torch::data::Example<>");
      return example_batch(std::move(out), indices);
    }
  } else if constexpr (!is_loadable_v<Dataset>) {
    return {};  // refused by DataLoader's static_assert; nothing more to report
  } else if constexpr (has_get_batch<Dataset>::value) {
    return dataset.get_batch(indices);
  } else {
    std::vector<torch::data::Example<>> examples;
    examples.reserve(indices.size());
    for (auto i : indices) examples.push_back(dataset.get(static_cast<size_t>(i)));
    return collate(std::move(examples), indices);
  }
}

// Walks the batches of one epoch plan. Prepared loaders add a device to move batches to, an
// observer told which batch is being yielded (the Accelerator's end-of-data detection) and a
// session kept alive until the epoch ends.
template <class Dataset>
class BatchIterator {
 public:
  using value_type = batch_t<Dataset>;
  using reference = value_type&;
  using difference_type = std::ptrdiff_t;
  using iterator_category = std::input_iterator_tag;
  using Observer = std::function<void(int64_t batch, int64_t num_batches, int64_t padding)>;

  BatchIterator() = default;
  BatchIterator(std::shared_ptr<Dataset> dataset, EpochPlan plan, int64_t pos, torch::Device device = torch::kCPU,
                Observer observer = {}, std::shared_ptr<void> session = {})
      : dataset_(std::move(dataset)),
        plan_(std::move(plan)),
        pos_(pos),
        device_(device),
        observer_(std::move(observer)),
        session_(std::move(session)) {}

  reference operator*() {
    if (!loaded_) {
      int64_t pad = 0;
      auto idx = plan_.batch(pos_, &pad);
      batch_ = fetch(*dataset_, idx);
      batch_.num_padding = pad;
      if (device_.type() != torch::kCPU) batch_ = batch_.to(device_, /*non_blocking=*/true);
      if (observer_) observer_(pos_, plan_.num_batches, pad);
      loaded_ = true;
    }
    return batch_;
  }
  value_type* operator->() { return &**this; }
  BatchIterator& operator++() {
    ++pos_;
    loaded_ = false;
    if (pos_ >= plan_.num_batches) session_.reset();  // the epoch is over
    return *this;
  }
  bool operator!=(const BatchIterator& other) const { return pos_ != other.pos_; }
  bool operator==(const BatchIterator& other) const { return pos_ == other.pos_; }

 private:
  std::shared_ptr<Dataset> dataset_;
  EpochPlan plan_;
  int64_t pos_ = 0;
  torch::Device device_{torch::kCPU};
  Observer observer_;
  std::shared_ptr<void> session_;
  value_type batch_;
  bool loaded_ = false;
};

// Walks one epoch of a stream dataset for one rank with Accelerate's IterableDatasetShard
// semantics: the stream is read in rounds of batch_size x world samples (the global batch
// with split_batches), rank r takes the r-th slice of each; the last, short round is dropped
// with drop_last, else completed with the epoch's first samples (padding, counted in
// num_padding). One process: plain batches, the last one short. Batch indices are the
// samples' positions in the epoch's stream. It reads one round ahead, to tell the observer
// which batch is the last.
template <class Dataset>
class StreamIterator {
  struct Round {
    std::vector<torch::data::Example<>> examples;  // this rank's slice
    std::vector<int64_t> positions;
    int64_t padding = 0;
  };

 public:
  using value_type = Batch;
  using reference = value_type&;
  using difference_type = std::ptrdiff_t;
  using iterator_category = std::input_iterator_tag;
  using Observer = std::function<void(int64_t batch, int64_t num_batches, int64_t padding)>;
  static constexpr int64_t kEnd = std::numeric_limits<int64_t>::max();

  StreamIterator() = default;
  explicit StreamIterator(int64_t pos) : pos_(pos) {}
  StreamIterator(std::shared_ptr<Dataset> dataset, const EpochPlan& plan, bool drop_last,
                 torch::Device device = torch::kCPU, Observer observer = {}, std::shared_ptr<void> session = {})
      : dataset_(std::move(dataset)),
        per_rank_(plan.batch_size),
        world_(plan.world_size),
        rank_(plan.rank),
        drop_last_(drop_last),
        device_(device),
        observer_(std::move(observer)),
        session_(std::move(session)) {
    if constexpr (has_set_epoch<Dataset>::value) dataset_->set_epoch(plan.epoch);
    dataset_->reset();
    // Resumed or skipped batches: read past their rounds.
    for (pos_ = 0; pos_ < plan.first_batch; ++pos_)
      if (!read_round()) break;
    current_ = read_round();
    if (current_) ahead_ = read_round();
    if (!current_) finish();
  }

  reference operator*() {
    if (!loaded_) {
      auto examples = current_->examples;
      batch_ = collate(std::move(examples), current_->positions);
      batch_.num_padding = current_->padding;
      if (device_.type() != torch::kCPU) batch_ = batch_.to(device_, /*non_blocking=*/true);
      if (observer_) observer_(pos_, ahead_ ? pos_ + 2 : pos_ + 1, current_->padding);
      loaded_ = true;
    }
    return batch_;
  }
  value_type* operator->() { return &**this; }
  StreamIterator& operator++() {
    ++pos_;
    loaded_ = false;
    current_ = std::move(ahead_);
    ahead_.reset();
    if (current_)
      ahead_ = read_round();
    else
      finish();
    return *this;
  }
  bool operator!=(const StreamIterator& other) const { return pos_ != other.pos_; }
  bool operator==(const StreamIterator& other) const { return pos_ == other.pos_; }

 private:
  void finish() {
    pos_ = kEnd;
    session_.reset();  // the epoch is over
  }

  // This rank's slice of the next round, or none when the epoch has no more batches.
  std::optional<Round> read_round() {
    if (ended_) return std::nullopt;
    const bool split_world = world_ > 1;
    const int64_t round = per_rank_ * world_;
    std::vector<torch::data::Example<>> samples;
    std::vector<int64_t> positions;
    while (static_cast<int64_t>(samples.size()) < round) {
      auto next = dataset_->next();
      if (!next) break;
      samples.push_back(std::move(*next));
      positions.push_back(stream_pos_++);
    }
    const int64_t real = static_cast<int64_t>(samples.size());
    if (real < round) ended_ = true;
    if (real == 0 || (real < round && drop_last_)) return std::nullopt;
    if (first_.empty()) first_ = samples, first_positions_ = positions;
    Round out;
    if (!split_world) {  // one process: the batch as read, short or not
      out.examples = std::move(samples);
      out.positions = std::move(positions);
      return out;
    }
    for (int64_t p = rank_ * per_rank_; p < (rank_ + 1) * per_rank_; ++p) {
      if (p < real) {
        out.examples.push_back(samples[static_cast<size_t>(p)]);
        out.positions.push_back(positions[static_cast<size_t>(p)]);
      } else {  // completed with the epoch's first samples, repeated as needed
        const size_t q = static_cast<size_t>(p - real) % first_.size();
        out.examples.push_back(first_[q]);
        out.positions.push_back(first_positions_[q]);
        ++out.padding;
      }
    }
    return out;
  }

  std::shared_ptr<Dataset> dataset_;
  int64_t per_rank_ = 1, world_ = 1, rank_ = 0;
  bool drop_last_ = false;
  torch::Device device_{torch::kCPU};
  Observer observer_;
  std::shared_ptr<void> session_;
  int64_t pos_ = kEnd;
  int64_t stream_pos_ = 0;
  bool ended_ = false;
  std::optional<Round> current_, ahead_;
  std::vector<torch::data::Example<>> first_;  // the epoch's first round (completes the last)
  std::vector<int64_t> first_positions_;
  value_type batch_;
  bool loaded_ = false;
};

// The plan of a stream epoch: how many samples each rank takes per round (no order, no
// number of batches: the stream decides). Throws hasten::Error on impossible specs.
EpochPlan make_stream_plan(const ShardSpec& spec, int64_t epoch);

template <class Dataset>
using loader_iterator_t =
    std::conditional_t<is_stream_dataset_v<Dataset>, StreamIterator<Dataset>, BatchIterator<Dataset>>;

}  // namespace detail

// A loader over a map-style dataset. Iterating it directly (without prepare) walks one
// process's epochs: the same batches a prepared loader yields in a one-process run.
template <class Dataset>
class DataLoader {
  // One message per kind of mistake, and only one of them fires.
  static_assert(!detail::is_torch_loader_v<Dataset>,
                "hasten::DataLoader takes a dataset, not a LibTorch data loader: pass it the dataset "
                "you gave torch::data::make_data_loader, with {.batch_size = ...}");
  static_assert(!detail::is_torch_dataset_v<Dataset> || detail::is_torch_map_dataset<Dataset>::value,
                "hasten::DataLoader takes map-style datasets only (get_batch of indices and a known "
                "size: torch::data::datasets::Dataset, MNIST, their .map()); a stateful or stream "
                "dataset (ChunkDataset, StreamDataset) has no indices to shard across processes");
  static_assert(detail::is_torch_loader_v<Dataset> || detail::is_torch_dataset_v<Dataset> ||
                    detail::is_hasten_dataset_v<Dataset> || detail::is_stream_dataset_v<Dataset>,
                "hasten::DataLoader needs a dataset: a LibTorch map-style dataset, a type with "
                "size() and either `hasten::Batch get_batch(const std::vector<int64_t>&) const` or "
                "`torch::data::Example<> get(size_t)`, or a stream with "
                "`std::optional<torch::data::Example<>> next()` and `void reset()`");

 public:
  using dataset_type = Dataset;
  using batch_type = detail::batch_t<Dataset>;

  explicit DataLoader(Dataset dataset, DataLoaderOptions options = {})
      : dataset_(std::make_shared<Dataset>(std::move(dataset))), options_(options) {}

  Dataset& dataset() { return *dataset_; }
  const Dataset& dataset() const { return *dataset_; }
  std::shared_ptr<Dataset> dataset_ptr() const { return dataset_; }
  const DataLoaderOptions& options() const { return options_; }
  // A stream dataset has no size: this and size() throw hasten::UsageError for one.
  size_t dataset_size() const {
    if constexpr (detail::is_stream_dataset_v<Dataset>)
      throw UsageError("hasten::DataLoader: a stream dataset has no size (it ends when next() gives none)");
    else
      return detail::dataset_size(*dataset_);
  }
  static constexpr bool is_stream = detail::is_stream_dataset_v<Dataset>;

  using iterator = detail::loader_iterator_t<Dataset>;

  // Each call to begin() starts the next epoch (at batch skipped_batches()).
  iterator begin() {
    if constexpr (is_stream) {
      detail::ShardSpec spec{-1, options_, 1, 0, true, false};
      auto plan = detail::make_stream_plan(spec, epoch_++);
      plan.first_batch = skip_;  // read past them
      return iterator(dataset_, plan, options_.drop_last);
    } else {
      detail::ShardSpec spec{static_cast<int64_t>(dataset_size()), options_, 1, 0, true, false};
      auto plan = detail::make_epoch_plan(spec, epoch_);
      plan.epoch = epoch_++;
      end_pos_ = plan.num_batches;
      const int64_t first = std::min(skip_, plan.num_batches);
      return iterator(dataset_, std::move(plan), first);
    }
  }
  iterator end() {
    if constexpr (is_stream)
      return iterator(iterator::kEnd);
    else
      return iterator(nullptr, {}, end_pos_);
  }
  // Batches per epoch, less those skip_first_batches skips.
  size_t size() const {
    detail::ShardSpec spec{static_cast<int64_t>(dataset_size()), options_, 1, 0, true, false};
    return static_cast<size_t>(std::max<int64_t>(0, detail::count_batches(spec) - skip_));
  }
  // The epoch the next begin() starts (its shuffle: seed + epoch); set_epoch chooses it.
  int64_t epoch() const { return epoch_; }
  void set_epoch(int64_t epoch) {
    if (epoch < 0) throw UsageError("DataLoader::set_epoch: the epoch must be >= 0, got " + std::to_string(epoch));
    epoch_ = epoch;
  }
  // The batches skip_first_batches skips at the start of each epoch (0 for a loader built).
  int64_t skipped_batches() const { return skip_; }

  template <class D>
  friend DataLoader<D> skip_first_batches(const DataLoader<D>& loader, int64_t num_batches);

 private:
  std::shared_ptr<Dataset> dataset_;
  DataLoaderOptions options_;
  int64_t epoch_ = 0;
  int64_t end_pos_ = 0;
  int64_t skip_ = 0;
};

// Accelerate's skip_first_batches of a loader that was not prepared (its SkipBatchSampler, or
// SkipDataLoader for a stream): a copy over the same dataset, at the same epoch, whose every
// epoch starts at batch `num_batches` (a stream is read past them); size() less them. As in
// Accelerate, the copy counts its epochs apart from the loader it came from.
template <class Dataset>
DataLoader<Dataset> skip_first_batches(const DataLoader<Dataset>& loader, int64_t num_batches) {
  if (num_batches < 0)
    throw UsageError("skip_first_batches: num_batches must be >= 0, got " + std::to_string(num_batches));
  DataLoader<Dataset> out = loader;
  out.skip_ = num_batches;
  return out;
}

}  // namespace hasten
