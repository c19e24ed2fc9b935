// The prepared data loaders as the engine tracks them (engine/loader_tracking.cpp keeps it;
// checkpoints store and restore each loader's position): each loader's shard and epoch, and
// the loaders being iterated now, innermost last.
#pragma once

#include <hasten/detail/data_plan.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace hasten::detail {

struct LoaderEntry {
  ShardSpec spec;
  int64_t epoch = 0;
  int64_t num_batches = 0;
  int64_t resume_batch = 0;  // after load_state: the first batch of the next epoch begun
  EpochPlan last_plan;       // the plan of the epoch begun last (gather_for_metrics after it)
  bool stream = false;       // a stream dataset: no size, batches until the stream ends
};

struct ActiveLoader {
  size_t id = 0;
  int64_t batch = -1;
  int64_t num_batches = 0;
  int64_t num_padding = 0;
};

struct LoaderRegistry {
  std::vector<LoaderEntry> loaders;  // by id, in the order prepared
  std::vector<ActiveLoader> active;  // innermost loader last
  // The loader whose iteration ended last, and whether it ran to the end of its epoch (a
  // whole-epoch gather_for_metrics after the loop drops that epoch's padding).
  std::optional<size_t> finished;

  const ActiveLoader* innermost() const { return active.empty() ? nullptr : &active.back(); }
  bool end_of_dataloader() const {
    const ActiveLoader* a = innermost();
    return a != nullptr && a->batch >= 0 && a->batch == a->num_batches - 1;
  }
};

}  // namespace hasten::detail
