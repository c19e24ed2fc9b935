// hasten's data loader for map-style datasets.
//
// A dataset is any type with `size()` (size_t or std::optional<size_t>) and either
//   Batch get_batch(const std::vector<int64_t>& indices) const   // fast path, or
//   torch::data::Example<> get(size_t index)                     // collated by stacking.
// TensorDataset wraps two tensors and slices batches without copying when the indices are
// consecutive.
//
//   hasten::DataLoader loader(hasten::TensorDataset(x, y), {.batch_size = 32, .shuffle = true});
//   auto prepared = acc.prepare(loader);
//   for (auto& batch : prepared) { batch.input; batch.target; }
//
// A prepared loader gives rank r its share of one global order (the same seed on every rank,
// a new order each epoch: seed + epoch), and tells the Accelerator when it is about to yield
// its last batch, so accumulate() synchronises there.
#pragma once

#include <torch/data/example.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
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

struct DataLoaderOptions {
  int64_t batch_size = 1;  // per process (the global batch with split_batches)
  bool shuffle = false;
  uint64_t seed = 0;  // shuffle order of epoch e: permutation seeded with seed + e
  bool drop_last = false;
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
  std::shared_ptr<const std::vector<int64_t>> order;  // permutation of [0, N)
  int64_t dataset_size = 0;
  int64_t batch_size = 0;  // per rank
  int64_t world_size = 1;
  int64_t rank = 0;
  int64_t num_batches = 0;  // this rank's
  bool pad = false;         // complete short rounds by wrapping around
  int64_t first_batch = 0;  // where iteration starts (after load_state: mid-epoch)

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
};

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

template <class T>
size_t dataset_size(const T& dataset) {
  if constexpr (std::is_convertible_v<decltype(dataset.size()), size_t>) {
    return dataset.size();
  } else {
    auto n = dataset.size();
    if (!n) throw std::runtime_error("hasten::DataLoader needs a dataset with a known size");
    return *n;
  }
}

// Stacks examples into a batch.
Batch collate(std::vector<torch::data::Example<>> examples, const std::vector<int64_t>& indices);

template <class Dataset>
Batch fetch(Dataset& dataset, const std::vector<int64_t>& indices) {
  if constexpr (has_get_batch<Dataset>::value) {
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
  using value_type = Batch;
  using reference = Batch&;
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

  Batch& operator*() {
    if (!loaded_) {
      int64_t pad = 0;
      auto idx = plan_.batch(pos_, &pad);
      batch_ = fetch(*dataset_, idx);
      batch_.num_padding = pad;
      if (device_.type() != torch::kCPU) batch_ = batch_.to(device_);
      if (observer_) observer_(pos_, plan_.num_batches, pad);
      loaded_ = true;
    }
    return batch_;
  }
  Batch* operator->() { return &**this; }
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
  Batch batch_;
  bool loaded_ = false;
};

}  // namespace detail

// A loader over a map-style dataset. Iterating it directly (without prepare) walks one
// process's epochs: the same batches a prepared loader yields in a one-process run.
template <class Dataset>
class DataLoader {
 public:
  using dataset_type = Dataset;

  explicit DataLoader(Dataset dataset, DataLoaderOptions options = {})
      : dataset_(std::make_shared<Dataset>(std::move(dataset))), options_(options) {}

  Dataset& dataset() { return *dataset_; }
  const Dataset& dataset() const { return *dataset_; }
  std::shared_ptr<Dataset> dataset_ptr() const { return dataset_; }
  const DataLoaderOptions& options() const { return options_; }
  size_t dataset_size() const { return detail::dataset_size(*dataset_); }

  using iterator = detail::BatchIterator<Dataset>;

  // Each call to begin() starts the next epoch.
  iterator begin() {
    detail::ShardSpec spec{static_cast<int64_t>(dataset_size()), options_, 1, 0, true, false};
    auto plan = detail::make_epoch_plan(spec, epoch_++);
    end_pos_ = plan.num_batches;
    return iterator(dataset_, std::move(plan), 0);
  }
  iterator end() { return iterator(nullptr, {}, end_pos_); }
  size_t size() const {
    detail::ShardSpec spec{static_cast<int64_t>(dataset_size()), options_, 1, 0, true, false};
    return static_cast<size_t>(detail::count_batches(spec));
  }

 private:
  std::shared_ptr<Dataset> dataset_;
  DataLoaderOptions options_;
  int64_t epoch_ = 0;
  int64_t end_pos_ = 0;
};

}  // namespace hasten
