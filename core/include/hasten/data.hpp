// hasten's data loader, for map-style and stream datasets.
//
// A dataset is either hasten-style: any type with `size()` (size_t or std::optional<size_t>)
// and either
//   Batch get_batch(const std::vector<int64_t>& indices) const   // fast path, or
//   torch::data::Example<> get(size_t index)                     // collated by stacking, or
//   hasten::TensorDict get(size_t index)     // named tensors: each name stacked into Batch::fields,
// the last two through DataLoaderOptions::collate when one is given (PyTorch's collate_fn),
// or one of LibTorch's map-style datasets: torch::data::datasets::MNIST, a user's
// `struct MyData : torch::data::datasets::Dataset<MyData>`, and their .map(...) with
// transforms such as Normalize<> and Stack<>. LibTorch's are fetched with
// get_batch(ArrayRef<size_t>); a std::vector<Example<>> result is stacked, an Example<>
// (after Stack<>) is used as it is. LibTorch's stateful and stream datasets (ChunkDataset,
// StreamDataset) are refused at compile time: they have no indices to shard. hasten's own
// stream datasets (`std::optional<torch::data::Example<>> next()` and `void reset()`) are, by
// default (dispatch_batches unset), read by rank 0 alone, which broadcasts each round and every
// rank keeps its slice (Accelerate's DataLoaderDispatcher); with dispatch_batches false every
// rank reads the stream and keeps its slice of each round (Accelerate's IterableDatasetShard).
// DataLoaderOptions::sampler and ::batch_sampler (samplers.hpp) replace the order or the
// batches of map-style datasets.
// TensorDataset wraps two tensors and slices batches without copying when the indices are
// consecutive.
//
//   hasten::DataLoader loader(hasten::TensorDataset(x, y), {.batch_size = 32, .shuffle = true});
//   auto prepared = acc.prepare(loader);
//   for (auto& batch : prepared) { batch.input; batch.target; }       // hasten::Batch
//
//   struct Tokens { size_t size() const; hasten::TensorDict get(size_t i) const; };  // {"input_ids", "labels"}
//   hasten::DataLoader lm(Tokens{...}, {.batch_size = 8, .collate = pad_to_longest});
//   for (auto& batch : acc.prepare(lm)) { batch["input_ids"]; batch["labels"]; }
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

#include <hasten/batch.hpp>
#include <hasten/detail/batch_iterators.hpp>
#include <hasten/detail/data_plan.hpp>
#include <hasten/detail/dataset_traits.hpp>
#include <hasten/error.hpp>
#include <hasten/samplers.hpp>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace hasten {


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
                "`torch::data::Example<> get(size_t)` (or `hasten::TensorDict get(size_t)`), or a stream with "
                "`std::optional<torch::data::Example<>> next()` and `void reset()`");

 public:
  using dataset_type = Dataset;
  using batch_type = detail::batch_t<Dataset>;

  explicit DataLoader(Dataset dataset, DataLoaderOptions options = {})
      : dataset_(std::make_shared<Dataset>(std::move(dataset))), options_(std::move(options)) {
    if (options_.collate && !detail::takes_collate_v<Dataset>)
      throw UsageError(std::string("hasten::DataLoader: collate applies to map-style datasets whose get(size_t) returns "
                                   "a sample; this dataset makes its batches itself (") +
                       (detail::is_stream_dataset_v<Dataset> ? "a stream dataset" : "get_batch") + ")");
  }

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
      return iterator(dataset_, std::move(plan), first, torch::kCPU, {}, {}, detail::BatchReading::of(options_));
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
