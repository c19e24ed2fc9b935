// The gradient accumulation state machine's state (accumulation.cpp writes it; step.cpp and
// checkpoints read it): where the run is in its accumulation window and whether the live
// accumulate scope has seen its backward.
#pragma once

#include <cstdint>

namespace hasten::detail {

struct AccumulationState {
  bool sync = true;        // this micro-batch synchronises gradients and steps
  int64_t step = 0;        // micro-batches into the window (what a checkpoint stores)
  int64_t window = 1;      // micro-batches in the current window (a short last one is shorter)
  int depth = 0;           // live accumulate scopes
  bool backward_in_scope = false;   // a backward ran inside the live accumulate scope
  bool scope_ended_unused = false;  // the last scope ended with no backward inside it
};

}  // namespace hasten::detail
