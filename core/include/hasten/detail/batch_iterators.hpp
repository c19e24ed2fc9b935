// The iterators of one epoch (map-style: BatchIterator over an EpochPlan; stream:
// StreamIterator with Accelerate's IterableDatasetShard rounds) and how a batch is fetched.
// Not part of the API: included by data.hpp's templates.
#pragma once

#include <hasten/batch.hpp>
#include <hasten/detail/batch_prefetcher.hpp>
#include <hasten/detail/data_plan.hpp>
#include <hasten/detail/dataset_traits.hpp>
#include <hasten/error.hpp>

#include <ATen/record_function.h>
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

namespace hasten::detail {

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

// Says once per process that pin_memory has no use on this run's device (the CPU).
void warn_pin_memory_unused();

// Stacks examples into a batch.
Batch collate(std::vector<torch::data::Example<>> examples, const std::vector<int64_t>& indices);
ExampleBatch collate_examples(std::vector<torch::data::Example<>> examples,
                              const std::vector<int64_t>& indices);
// A batch already stacked (by Stack<> or the dataset's own get_batch).
ExampleBatch example_batch(torch::data::Example<> stacked, const std::vector<int64_t>& indices);
// Samples of named tensors into a batch: the user's collate, or each name stacked; checks that
// every tensor holds the samples along dim 0 (naming the sample or field that does not).
Batch collate_samples(std::vector<TensorDict> samples, const std::vector<int64_t>& indices,
                      const std::function<Batch(std::vector<TensorDict>)>& collate);
TensorDict as_sample(torch::data::Example<> example);  // {"input": data, "target": target}

template <class Dataset>
batch_t<Dataset> fetch(Dataset& dataset, const std::vector<int64_t>& indices,
                       const std::function<Batch(std::vector<TensorDict>)>& collate = {}) {
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
  } else if constexpr (get_returns_sample<Dataset>::value) {
    std::vector<TensorDict> samples;
    samples.reserve(indices.size());
    for (auto i : indices) samples.push_back(dataset.get(static_cast<size_t>(i)));
    return collate_samples(std::move(samples), indices, collate);
  } else {
    std::vector<torch::data::Example<>> examples;
    examples.reserve(indices.size());
    for (auto i : indices) examples.push_back(dataset.get(static_cast<size_t>(i)));
    if (!collate) return detail::collate(std::move(examples), indices);
    std::vector<TensorDict> samples;
    samples.reserve(examples.size());
    for (auto& e : examples) samples.push_back(as_sample(std::move(e)));
    return collate_samples(std::move(samples), indices, collate);
  }
}

// Whether DataLoaderOptions::collate can apply to Dataset (map-style, get(size_t)).
template <class Dataset>
constexpr bool takes_collate_v = is_hasten_dataset_v<Dataset> && !has_get_batch<Dataset>::value;

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
                Observer observer = {}, std::shared_ptr<void> session = {}, BatchReading reading = {})
      : dataset_(std::move(dataset)),
        plan_(std::move(plan)),
        pos_(pos),
        device_(device),
        observer_(std::move(observer)),
        session_(std::move(session)),
        reading_(reading) {
    // Page-locked memory only speeds up a copy to a CUDA device: on the CPU it is not used.
    if (reading_.pin_memory && !device_.is_cuda() && dataset_) {
      warn_pin_memory_unused();
      reading_.pin_memory = false;
    }
  }

  reference operator*() {
    if (!loaded_) {
      RECORD_USER_SCOPE("hasten::data_wait");  // a range in any LibTorch profile (config key profile)
      int64_t pad = 0;
      if (reading_.num_workers > 0) {
        if (!prefetcher_)
          prefetcher_ = std::make_shared<Prefetcher>(
              plan_, pos_, reading_,
              [ds = dataset_, c = reading_.collate](const std::vector<int64_t>& idx) { return fetch(*ds, idx, c); });
        batch_ = prefetcher_->take(pos_);
        pad = batch_.num_padding;
      } else {
        auto idx = plan_.batch(pos_, &pad);
        batch_ = fetch(*dataset_, idx, reading_.collate);
        batch_.num_padding = pad;
        if (reading_.pin_memory) batch_ = batch_.pin_memory();
      }
      if (device_.type() != torch::kCPU) batch_ = batch_.to(device_, reading_.non_blocking);
      if (observer_) observer_(pos_, plan_.num_batches, pad);
      loaded_ = true;
    }
    return batch_;
  }
  value_type* operator->() { return &**this; }
  BatchIterator& operator++() {
    ++pos_;
    loaded_ = false;
    if (pos_ >= plan_.num_batches) {
      session_.reset();  // the epoch is over
      prefetcher_.reset();
    }
    return *this;
  }
  bool operator!=(const BatchIterator& other) const { return pos_ != other.pos_; }
  bool operator==(const BatchIterator& other) const { return pos_ == other.pos_; }

 private:
  using FetchFn = std::function<value_type(const std::vector<int64_t>&)>;
  using Prefetcher = BatchPrefetcher<Dataset, FetchFn>;
  std::shared_ptr<Dataset> dataset_;
  EpochPlan plan_;
  int64_t pos_ = 0;
  torch::Device device_{torch::kCPU};
  Observer observer_;
  std::shared_ptr<void> session_;
  BatchReading reading_;
  std::shared_ptr<Prefetcher> prefetcher_;
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


template <class Dataset>
using loader_iterator_t =
    std::conditional_t<is_stream_dataset_v<Dataset>, StreamIterator<Dataset>, BatchIterator<Dataset>>;


}  // namespace hasten::detail
