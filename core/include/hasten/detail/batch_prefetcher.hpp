// DataLoaderOptions::num_workers: worker threads that fetch and collate an epoch's batches
// ahead of the training thread and hand them over in the epoch's order. Not part of the API:
// included by batch_iterators.hpp.
#pragma once

#include <hasten/batch.hpp>
#include <hasten/detail/data_plan.hpp>
#include <hasten/detail/dataset_traits.hpp>
#include <hasten/error.hpp>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace hasten::detail {

// How an iterator reads its batches (from DataLoaderOptions).
struct BatchReading {
  int num_workers = 0;      // 0: on the training thread, when needed
  int depth = 0;            // batches fetched ahead in all (num_workers x prefetch_factor)
  bool pin_memory = false;  // pin each batch (only where it then goes to a CUDA device)
  bool non_blocking = false;
  std::function<Batch(std::vector<TensorDict>)> collate;  // the user's, or unset

  static BatchReading of(const DataLoaderOptions& o) {
    BatchReading r;
    r.num_workers = o.num_workers;
    r.depth = o.num_workers * o.prefetch_factor.value_or(2);
    r.pin_memory = o.pin_memory;
    r.non_blocking = o.non_blocking;
    r.collate = o.collate;
    return r;
  }
};

// The text of an exception a worker caught, for the error the training thread sees.
std::string describe_exception(const std::exception_ptr& error);

// Batches [first, plan.num_batches) of one epoch, fetched by `workers` threads at most `depth`
// batches ahead of the one the training thread takes. Each batch depends only on its indices,
// so the batches, in the order taken, are the ones one thread would fetch. A batch whose fetch
// failed is an error when it is taken, naming the batch and its samples. Destroying the
// prefetcher (the loop ended, broke off or threw) stops the workers after the fetch each has
// under way.
template <class Dataset, class Fetch>
class BatchPrefetcher {
 public:
  using Batch = batch_t<Dataset>;

  BatchPrefetcher(EpochPlan plan, int64_t first, const BatchReading& reading, Fetch fetch)
      : plan_(std::move(plan)), next_(first), taken_(first), depth_(std::max(1, reading.depth)),
        pin_(reading.pin_memory), fetch_(std::move(fetch)) {
    threads_.reserve(static_cast<size_t>(reading.num_workers));
    try {
      for (int i = 0; i < reading.num_workers; ++i) threads_.emplace_back([this] { work(); });
    } catch (...) {
      stop();  // a thread that could not start: the others are joined before the error goes on
      throw;
    }
  }
  ~BatchPrefetcher() { stop(); }
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  // Batch `pos` (the one after the last taken), waiting for a worker to finish it. A batch is
  // taken once: a second take (two copies of one iterator dereferenced at the same position)
  // is an error, not a wait that never ends.
  Batch take(int64_t pos) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (pos <= last_taken_)
      throw UsageError("DataLoader: batch " + std::to_string(pos) +
                       " was already handed over by the workers (two copies of one iterator read the same epoch)");
    last_taken_ = pos;
    taken_ = pos;
    changed_.notify_all();  // the window moved: workers may fetch up to pos + depth
    changed_.wait(lock, [&] { return done_.count(pos) != 0; });
    Slot slot = std::move(done_.at(pos));
    done_.erase(pos);
    lock.unlock();
    if (slot.error) {
      std::string samples;
      for (size_t i = 0; i < slot.indices.size() && i < 16; ++i)
        samples += (i ? ", " : "") + std::to_string(slot.indices[i]);
      if (slot.indices.size() > 16) samples += ", ...";
      throw Error("DataLoader: a worker failed to read batch " + std::to_string(pos) + " (samples " + samples +
                  "): " + describe_exception(slot.error));
    }
    slot.batch.num_padding = slot.padding;
    return std::move(slot.batch);
  }

 private:
  struct Slot {
    Batch batch;
    int64_t padding = 0;
    std::vector<int64_t> indices;
    std::exception_ptr error;
  };

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }

  void work() {
    for (;;) {
      int64_t pos = 0;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return stop_ || next_ >= plan_.num_batches || next_ < taken_ + depth_; });
        if (stop_ || next_ >= plan_.num_batches) return;
        pos = next_++;
      }
      Slot slot;
      try {
        slot.indices = plan_.batch(pos, &slot.padding);
        slot.batch = fetch_(slot.indices);
        if (pin_) slot.batch = slot.batch.pin_memory();
      } catch (...) {
        slot.error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        done_.emplace(pos, std::move(slot));
      }
      changed_.notify_all();
    }
  }

  const EpochPlan plan_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int64_t next_;   // the next batch a worker claims
  int64_t taken_;  // the batch the training thread takes now
  int64_t last_taken_ = -1;
  const int64_t depth_;
  const bool pin_;
  Fetch fetch_;
  bool stop_ = false;
  std::map<int64_t, Slot> done_;
  std::vector<std::thread> threads_;
};

}  // namespace hasten::detail
