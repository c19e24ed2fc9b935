// dispatch_batches (Accelerate's DataLoaderDispatcher): rank 0 alone reads the loader the user
// built, as one process would, and broadcasts each round (N of its batches concatenated, one
// with split_batches); every rank keeps its slice. The broadcast and the slicing are
// core/src/engine/dispatch.cpp; this header holds the iterator a prepared loader yields when it
// dispatches, a template because reading the dataset is.
#pragma once

#include <hasten/data.hpp>
#include <hasten/detail/engine.hpp>

#include <torch/types.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace hasten::detail {

// One round as rank 0 read it: the base loader's batches concatenated along dim 0.
struct DispatchRound {
  torch::Tensor data, target;  // target undefined when the dataset has none
  torch::Tensor indices;       // int64: dataset indices (a stream: positions in the epoch's stream)
  int64_t rows() const { return indices.size(0); }
};

// This rank's slice of a round.
struct DispatchedBatch {
  torch::Tensor data, target, indices;
  int64_t num_padding = 0;
  bool last = false;  // the epoch's last round
};

// Concatenates base batches into a round (rank 0). hasten::Error, saying what to do instead,
// when their samples differ in shape (Accelerate's message for the same case).
DispatchRound concat_batches(const std::vector<DispatchRound>& batches);

// Collective over every rank. Rank 0 gives the round (none: the epoch has no more) and whether
// it is the last; `first` is the epoch's first round, needed only by a last round that the
// processes do not divide (its first rows complete it). Returns this rank's slice, none at the
// end. Tensors travel on the CPU; the iterator moves the slice to the device.
std::optional<DispatchedBatch> dispatch_round(Engine& engine, const EpochPlan& plan,
                                              const std::optional<DispatchRound>& round, bool last,
                                              const DispatchRound* first);

// Walks one dispatched epoch. Rank 0 reads one round ahead (to tell every rank which round is
// the last, as the DataLoaderDispatcher fetches ahead); the other ranks never touch the
// dataset (a stream is only told its epoch, as Accelerate's set_epoch does on every rank).
template <class Dataset>
class DispatchIterator {
 public:
  using value_type = batch_t<Dataset>;
  using reference = value_type&;
  using difference_type = std::ptrdiff_t;
  using iterator_category = std::input_iterator_tag;
  using Observer = std::function<void(int64_t batch, int64_t num_batches, int64_t padding)>;
  static constexpr int64_t kEnd = std::numeric_limits<int64_t>::max();

  DispatchIterator() = default;
  explicit DispatchIterator(int64_t pos) : pos_(pos) {}
  DispatchIterator(std::shared_ptr<Dataset> dataset, std::shared_ptr<Engine> engine, EpochPlan plan,
                   torch::Device device = torch::kCPU, Observer observer = {}, std::shared_ptr<void> session = {})
      : dataset_(std::move(dataset)),
        engine_(std::move(engine)),
        plan_(std::move(plan)),
        device_(device),
        observer_(std::move(observer)),
        session_(std::move(session)) {
    if constexpr (is_stream_dataset_v<Dataset> && has_set_epoch<Dataset>::value) dataset_->set_epoch(plan_.epoch);
    if (plan_.rank == 0) {
      if constexpr (is_stream_dataset_v<Dataset>) {
        dataset_->reset();
        for (int64_t b = 0; b < plan_.first_batch; ++b)  // a stream is read past skipped rounds
          if (!read_round()) break;
      } else {
        base_pos_ = plan_.first_batch * per_round();
        skipped_ = plan_.first_batch > 0;
      }
      current_ = read_round();
      if (current_) ahead_ = read_round();
    }
    pos_ = plan_.first_batch;
    receive();
  }

  reference operator*() {
    if (!loaded_) {
      batch_ = value_type{};
      if constexpr (std::is_same_v<value_type, ExampleBatch>)
        batch_.data = slice_.data;
      else
        batch_.input = slice_.data;
      batch_.target = slice_.target;
      batch_.indices = slice_.indices;
      batch_.num_padding = slice_.num_padding;
      if (device_.type() != torch::kCPU) batch_ = batch_.to(device_);
      const int64_t total =
          is_stream_dataset_v<Dataset> ? (slice_.last ? pos_ + 1 : pos_ + 2) : plan_.num_batches;
      if (observer_) observer_(pos_, total, slice_.num_padding);
      loaded_ = true;
    }
    return batch_;
  }
  value_type* operator->() { return &**this; }
  DispatchIterator& operator++() {
    loaded_ = false;
    if (slice_.last) {  // every rank knows: no collective for the end
      finish();
      return *this;
    }
    ++pos_;
    if (plan_.rank == 0) {
      current_ = std::move(ahead_);
      ahead_.reset();
      if (current_) ahead_ = read_round();
    }
    receive();
    return *this;
  }
  bool operator!=(const DispatchIterator& other) const { return pos_ != other.pos_; }
  bool operator==(const DispatchIterator& other) const { return pos_ == other.pos_; }

 private:
  int64_t per_round() const { return plan_.split ? 1 : plan_.world_size; }

  void finish() {
    pos_ = kEnd;
    session_.reset();  // the epoch is over
  }

  // The round's collective; every rank calls it in the same order.
  void receive() {
    const DispatchRound* first = nullptr;
    if (plan_.rank == 0 && current_ && !ahead_ && !plan_.drop_last && current_->rows() % plan_.world_size != 0)
      first = &first_round();
    auto got = dispatch_round(*engine_, plan_, current_, !ahead_, first);
    if (!got) {
      finish();
      return;
    }
    slice_ = std::move(*got);
  }

  // Rank 0: the base loader's next batch, none at its end.
  std::optional<DispatchRound> read_base() {
    if constexpr (is_stream_dataset_v<Dataset>) {
      if (ended_) return std::nullopt;
      std::vector<torch::data::Example<>> samples;
      std::vector<int64_t> positions;
      while (static_cast<int64_t>(samples.size()) < plan_.batch_size) {
        auto next = dataset_->next();
        if (!next) {
          ended_ = true;
          break;
        }
        samples.push_back(std::move(*next));
        positions.push_back(stream_pos_++);
      }
      // The base loader's drop_last drops its short last batch.
      if (samples.empty() || (ended_ && plan_.drop_last)) return std::nullopt;
      Batch b = collate(std::move(samples), positions);
      return DispatchRound{b.input, b.target, b.indices};
    } else {
      if (base_pos_ >= plan_.base->num_batches) return std::nullopt;
      return base_batch(base_pos_++);
    }
  }

  DispatchRound base_batch(int64_t k) {
    auto b = fetch(*dataset_, plan_.base->batch(k, nullptr));
    if constexpr (std::is_same_v<value_type, ExampleBatch>) {
      return DispatchRound{b.data, b.target, b.indices};
    } else {
      if (!b.fields.empty())
        throw UsageError("dispatch_batches: rank 0 broadcasts a batch's input and target only, and this dataset's "
                         "batches have named fields ('" + b.fields.begin()->first +
                         "', ...); set dispatch_batches false for this loader (each rank then reads its own samples)");
      return DispatchRound{b.input, b.target, b.indices};
    }
  }

  // Rank 0: the next round, none when the epoch has no more (with drop_last, a round short of
  // base batches is dropped, as the DataLoaderDispatcher stops mid-fetch).
  std::optional<DispatchRound> read_round() {
    std::vector<DispatchRound> parts;
    for (int64_t i = 0; i < per_round(); ++i) {
      auto b = read_base();
      if (!b) break;
      parts.push_back(std::move(*b));
    }
    if (parts.empty() || (plan_.drop_last && static_cast<int64_t>(parts.size()) < per_round())) return std::nullopt;
    DispatchRound round = concat_batches(parts);
    if (rounds_read_++ == 0 && !skipped_) first_ = round;
    return round;
  }

  // Rank 0: the epoch's first round (a map-style epoch that skipped it reads it again).
  const DispatchRound& first_round() {
    if constexpr (!is_stream_dataset_v<Dataset>) {
      if (!first_) {
        std::vector<DispatchRound> parts;
        for (int64_t k = 0; k < std::min(per_round(), plan_.base->num_batches); ++k) parts.push_back(base_batch(k));
        first_ = concat_batches(parts);
      }
    }
    return *first_;
  }

  std::shared_ptr<Dataset> dataset_;
  std::shared_ptr<Engine> engine_;
  EpochPlan plan_;
  torch::Device device_{torch::kCPU};
  Observer observer_;
  std::shared_ptr<void> session_;
  int64_t pos_ = kEnd;
  // Rank 0's reading.
  int64_t base_pos_ = 0, stream_pos_ = 0, rounds_read_ = 0;
  bool ended_ = false, skipped_ = false;
  std::optional<DispatchRound> current_, ahead_, first_;
  DispatchedBatch slice_;
  value_type batch_;
  bool loaded_ = false;
};

// What a prepared loader's begin() and end() return: its own loader's iterator, or the
// dispatching one (chosen per loader at prepare; begin() and end() always agree).
template <class Dataset>
class PreparedIterator {
  using Plain = loader_iterator_t<Dataset>;
  using Dispatch = DispatchIterator<Dataset>;

 public:
  using value_type = batch_t<Dataset>;
  using reference = value_type&;
  using difference_type = std::ptrdiff_t;
  using iterator_category = std::input_iterator_tag;

  PreparedIterator(Plain it) : it_(std::move(it)) {}        // NOLINT: implicit by design
  PreparedIterator(Dispatch it) : it_(std::move(it)) {}     // NOLINT: implicit by design

  reference operator*() {
    return std::visit([](auto& it) -> reference { return *it; }, it_);
  }
  value_type* operator->() { return &**this; }
  PreparedIterator& operator++() {
    std::visit([](auto& it) { ++it; }, it_);
    return *this;
  }
  bool operator==(const PreparedIterator& other) const {
    if (it_.index() != other.it_.index()) return false;
    return std::visit(
        [&](const auto& it) { return it == std::get<std::decay_t<decltype(it)>>(other.it_); }, it_);
  }
  bool operator!=(const PreparedIterator& other) const { return !(*this == other); }

 private:
  std::variant<Plain, Dispatch> it_;
};

}  // namespace hasten::detail
