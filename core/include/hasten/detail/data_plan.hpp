// How one epoch of a loader is dealt to the ranks (data_loader.cpp): the plan every
// iterator walks. Not part of the API: included by data.hpp's templates.
#pragma once

#include <hasten/batch.hpp>

#include <cstdint>
#include <memory>
#include <vector>

namespace hasten::detail {

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

// The plan of a stream epoch: how many samples each rank takes per round (no order, no
// number of batches: the stream decides). Throws hasten::Error on impossible specs.
EpochPlan make_stream_plan(const ShardSpec& spec, int64_t epoch);


}  // namespace hasten::detail
