// hasten::GradientState: a snapshot of where gradient accumulation and data iteration stand
// (Accelerate's accelerator.gradient_state), and the options of join_uneven_inputs.
#pragma once

#include <cstdint>
#include <optional>

namespace hasten {

struct GradientState {
  // This micro-batch ends an accumulation window: the optimizer steps and, unless a no_sync
  // scope says otherwise, backward reduces gradients across processes.
  bool sync_gradients = true;
  // The micro-batches of the current window counted so far (Accelerate's accelerator.step;
  // 0 after a window that the loader's end closed).
  int64_t step = 0;
  int num_steps = 1;  // gradient_accumulation_steps
  bool sync_each_batch = false;
  bool sync_with_dataloader = true;
  // A prepared scheduler's step() on an accumulation micro-batch counts toward a bounded
  // schedule's total_steps (adjust_scheduler, in effect only with scheduler_steps_per_process).
  bool adjust_scheduler = false;
  // Iteration of a prepared loader is under way; active_dataloader is the innermost one's
  // index (PreparedDataLoader::index()), -1 outside any loader.
  bool in_dataloader = false;
  int64_t active_dataloader = -1;
  // The batch just yielded is the active loader's last of the epoch (false outside a loader).
  bool end_of_dataloader = false;
  // Samples of the dataset that do not fill the last global batch (dataset size modulo the
  // global batch); -1 outside a loader or with drop_last, as Accelerate reports it.
  int64_t remainder = -1;
};

// join_uneven_inputs's options (Accelerate's even_batches argument and torch's DDP Join hook's
// divide_by_initial_world_size).
struct JoinOptions {
  // Overrides even_batches for the prepared loaders whose epochs begin inside the scope.
  std::optional<bool> even_batches;
  // After some ranks have run out of batches, divide the reduced gradients by the initial
  // number of processes (true, torch's default: every sample weighs the same) or by the
  // processes that still train (false).
  bool divide_by_initial_world_size = true;
};

}  // namespace hasten
