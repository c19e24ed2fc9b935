// What a data loader yields (Batch, ExampleBatch), how one is configured (DataLoaderOptions),
// where a prepared one stands (LoaderState), and TensorDataset. data.hpp has the loaders.
#pragma once

#include <hasten/samplers.hpp>

#include <torch/data/example.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace hasten {

// One sample as named tensors (input_ids, attention_mask, labels, ...): what a dataset's
// get(size_t) may return instead of a torch::data::Example<>, and what a collate function takes.
using TensorDict = std::map<std::string, torch::Tensor>;

// One batch. Samples past `size() - num_padding` repeat earlier samples of the epoch: they
// pad the last round so every process gets the same number of full batches (even_batches),
// and gather_for_metrics drops them.
struct Batch {
  torch::Tensor input;
  torch::Tensor target;
  // Named tensors, samples along dim 0: a dataset whose get returns a TensorDict fills these (each
  // name stacked), as a collate function or a get_batch may.
  std::map<std::string, torch::Tensor> fields;
  torch::Tensor indices;  // int64 dataset indices of the samples
  int64_t num_padding = 0;

  // fields.at(name), or hasten::UsageError naming the fields the batch has.
  const torch::Tensor& operator[](const std::string& name) const;

  int64_t size() const;
  // The non-padding samples, as a boolean mask over dim 0.
  torch::Tensor real_mask() const;
  Batch to(const torch::Device& device, bool non_blocking = false) const;
  Batch pin_memory() const;  // input and target in page-locked memory
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
  ExampleBatch pin_memory() const;  // data and target in page-locked memory
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
  // Worker threads that fetch and collate the epoch's next batches while the training thread
  // computes (PyTorch's num_workers, as threads: a dataset read by workers must allow
  // concurrent const reads). Batches come out in the epoch's order, so every batch, and every
  // loss, is the same for any num_workers. 0: the training thread reads each batch when it
  // needs it. Map-style datasets without dispatch_batches.
  int num_workers = 0;
  // Batches each worker fetches ahead (PyTorch's default 2 when unset); needs num_workers > 0.
  std::optional<int> prefetch_factor = std::nullopt;
  // Workers put each batch in page-locked host memory, so that the copy to a CUDA device can
  // run asynchronously; a run on the CPU has no such copy (a warning says so).
  bool pin_memory = false;
  // Copy batches to a CUDA device with non_blocking (Accelerate's non_blocking; with
  // pin_memory the copy overlaps the computation).
  bool non_blocking = false;
  // PyTorch's collate_fn: makes one batch of the samples a dataset's get(size_t) returns (a
  // TensorDict, or a torch::data::Example<> passed as {"input": data, "target": target}), e.g. to
  // pad sequences of different lengths. Every tensor of the batch it returns must hold the
  // samples along dim 0; the loader sets its indices and padding. Unset: each tensor is
  // stacked. Map-style datasets with get(size_t) only (not get_batch, LibTorch's or streams);
  // on worker threads with num_workers.
  std::function<Batch(std::vector<TensorDict> samples)> collate = nullptr;
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

}  // namespace hasten
