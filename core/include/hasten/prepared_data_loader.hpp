// hasten::PreparedDataLoader: a data loader after Accelerator::prepare, yielding this rank's
// share of every epoch and telling the engine where iteration stands.
#pragma once

#include <hasten/data.hpp>
#include <hasten/detail/engine.hpp>

#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
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
                     size_t loader, torch::Device device)
      : dataset_(std::move(dataset)), engine_(std::move(engine)), loader_(loader), device_(device) {}

  using iterator = detail::BatchIterator<Dataset>;
  using batch_type = detail::batch_t<Dataset>;  // hasten::Batch, or ExampleBatch for LibTorch's

  // Each call starts the next epoch.
  iterator begin() {
    auto plan = engine_->loader_begin_epoch(loader_);
    end_pos_ = plan.num_batches;
    auto session = plan.first_batch < plan.num_batches ? std::make_shared<Session>(engine_, loader_)
                                        : nullptr;
    if (!session) engine_->loader_end(loader_);
    auto observer = [engine = engine_, id = loader_](int64_t batch, int64_t n, int64_t padding) {
      engine->loader_at(id, batch, n, padding);
    };
    const int64_t first = plan.first_batch;
    return iterator(dataset_, std::move(plan), first, device_, std::move(observer), std::move(session));
  }
  iterator end() { return iterator(nullptr, {}, end_pos_); }
  // Batches per epoch on this rank.
  size_t size() const { return static_cast<size_t>(engine_->loader_num_batches(loader_)); }
  Dataset& dataset() const { return *dataset_; }
  // Its index among the Accelerator's loaders (GradientState::active_dataloader).
  size_t index() const { return loader_; }

 private:
  std::shared_ptr<Dataset> dataset_;
  std::shared_ptr<detail::Engine> engine_;
  size_t loader_;
  torch::Device device_;
  int64_t end_pos_ = 0;
};

}  // namespace hasten
