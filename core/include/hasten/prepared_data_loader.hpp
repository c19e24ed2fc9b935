// hasten::PreparedDataLoader: a data loader after Accelerator::prepare, yielding this rank's
// share of every epoch and telling the engine where iteration stands.
#pragma once

#include <hasten/data.hpp>
#include <hasten/detail/dispatch.hpp>
#include <hasten/detail/engine.hpp>

#include <torch/types.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

namespace hasten {

// A data loader after prepare: this rank's share of each epoch's global order.
template <class Dataset>
class PreparedDataLoader {
  // Marks the loader active while an iteration is under way (for end-of-data detection).
  struct Session {
    Session(std::shared_ptr<detail::Engine> e, size_t l) : engine(std::move(e)), loader(l) {}
    ~Session() { engine->loader_end(loader); }
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;
    std::shared_ptr<detail::Engine> engine;
    size_t loader;
  };

 public:
  PreparedDataLoader(std::shared_ptr<Dataset> dataset, std::shared_ptr<detail::Engine> engine,
                     size_t loader, torch::Device device, detail::BatchReading reading = {})
      : dataset_(std::move(dataset)), engine_(std::move(engine)), loader_(loader), device_(device), reading_(reading) {}
  // A stream dataset's loader: drop_last decides whether the last short round is dropped.
  PreparedDataLoader(std::shared_ptr<Dataset> dataset, std::shared_ptr<detail::Engine> engine,
                     size_t loader, torch::Device device, bool drop_last)
      : dataset_(std::move(dataset)), engine_(std::move(engine)), loader_(loader), device_(device),
        drop_last_(drop_last) {}

  // Its own iterator, or with dispatch_batches the one that receives rank 0's rounds.
  using iterator = detail::PreparedIterator<Dataset>;
  using batch_type = detail::batch_t<Dataset>;  // hasten::Batch, or ExampleBatch for LibTorch's

  // Each call starts the next epoch.
  iterator begin() {
    auto plan = engine_->loader_begin_epoch(loader_, skip_);
    end_pos_ = plan.num_batches;
    auto session = plan.first_batch < plan.num_batches ? std::make_shared<Session>(engine_, loader_)
                                        : nullptr;
    if (!session) engine_->loader_end(loader_);
    auto observer = [engine = engine_, id = loader_](int64_t batch, int64_t n, int64_t padding) {
      engine->loader_at(id, batch, n, padding);
    };
    using Plain = detail::loader_iterator_t<Dataset>;
    if (plan.dispatch && reading_.collate)
      throw UsageError("dispatch_batches: rank 0 broadcasts a batch's input and target only, and this loader has a "
                       "collate function; set dispatch_batches false for it (each rank then reads its own samples)");
    if (plan.dispatch)
      return detail::DispatchIterator<Dataset>(dataset_, engine_, std::move(plan), device_, std::move(observer),
                                               std::move(session));
    if constexpr (detail::is_stream_dataset_v<Dataset>) {
      return Plain(dataset_, plan, drop_last_, device_, std::move(observer), std::move(session));
    } else {
      const int64_t first = plan.first_batch;
      return Plain(dataset_, std::move(plan), first, device_, std::move(observer), std::move(session), reading_);
    }
  }
  iterator end() {
    using Plain = detail::loader_iterator_t<Dataset>;
    if (engine_->loader_dispatches(loader_)) return detail::DispatchIterator<Dataset>(detail::DispatchIterator<Dataset>::kEnd);
    if constexpr (detail::is_stream_dataset_v<Dataset>)
      return Plain(Plain::kEnd);
    else
      return Plain(nullptr, {}, end_pos_);
  }
  // Batches per epoch on this rank (less those skip_first_batches skips). A stream has no
  // length: hasten::UsageError.
  size_t size() const {
    if constexpr (detail::is_stream_dataset_v<Dataset>)
      throw UsageError("PreparedDataLoader::size: a loader over a stream dataset has no length");
    else
      return static_cast<size_t>(std::max<int64_t>(0, engine_->loader_num_batches(loader_) - skip_));
  }
  Dataset& dataset() const { return *dataset_; }
  // Its index among the Accelerator's loaders (GradientState::active_dataloader).
  size_t index() const { return loader_; }

  // The epoch the next iteration begins (during one: the epoch under way); Accelerate's
  // `iteration`. After load_state, the checkpoint's epoch.
  int64_t epoch() const { return engine_->loader_epoch(loader_); }
  // Chooses the epoch the next iteration begins: its order (seed + epoch for shuffle and
  // RandomSampler) and what later ones count from. Set to the epoch a checkpoint resumes,
  // the loop continues at the saved batch; another epoch starts at its first batch. Not
  // while this loader is being iterated.
  void set_epoch(int64_t epoch) { engine_->loader_set_epoch(loader_, epoch); }

  // Accelerate's stateful loader (torchdata's StatefulDataLoader): where the next iteration
  // begins (inside the loop: the batch after the one just yielded), and going back there; the
  // next `for` then starts at that batch of that epoch. save_state records the same position
  // for every prepared loader. load_state_dict is not allowed while this loader is iterated.
  LoaderState state_dict() const { return engine_->loader_state(loader_); }
  void load_state_dict(const LoaderState& state) { engine_->loader_load_state(loader_, state); }

  // The batches skip_first_batches skips at the start of each epoch of this loader.
  int64_t skipped_batches() const { return skip_; }

  template <class D>
  friend PreparedDataLoader<D> skip_first_batches(const PreparedDataLoader<D>& loader, int64_t num_batches);

 private:
  std::shared_ptr<Dataset> dataset_;
  std::shared_ptr<detail::Engine> engine_;
  size_t loader_;
  torch::Device device_;
  detail::BatchReading reading_;  // num_workers, pin_memory, non_blocking (map-style loaders)
  int64_t end_pos_ = 0;
  int64_t skip_ = 0;
  bool drop_last_ = false;  // stream datasets
};

// Accelerate's skip_first_batches: the same prepared loader (the same epochs, position,
// end-of-data and checkpoint tracking) whose every epoch starts at batch `num_batches`, for
// loops that resume by counting batches themselves. After load_state, which already resumes
// mid-epoch, an epoch starts at the later of the two, so a ported loop does not skip twice.
template <class Dataset>
PreparedDataLoader<Dataset> skip_first_batches(const PreparedDataLoader<Dataset>& loader, int64_t num_batches) {
  if (num_batches < 0)
    throw UsageError("skip_first_batches: num_batches must be >= 0, got " + std::to_string(num_batches));
  PreparedDataLoader<Dataset> out = loader;
  out.skip_ = num_batches;
  return out;
}

}  // namespace hasten
