// join_uneven_inputs' state (join.cpp owns it; loader_tracking.cpp reads the even_batches
// override for epochs begun inside the scope).
#pragma once

#include <hasten/gradient_state.hpp>

#include <cstdint>
#include <optional>
#include <vector>

namespace hasten::detail {

struct JoinState {
  bool open = false;  // a join scope is open
  bool live = false;  // ... and inputs may be uneven: the engine reduces
  JoinOptions options;
  std::optional<bool> even_batches;   // the override for epochs begun inside the scope
  std::vector<int64_t> last_partial;  // the active ranks of the last round some had left
  // Under a sharding strategy (zero stages 1 and 2) the strategy keeps reducing; a rank out of
  // batches shadows the others' backwards, optimizer steps and clipping instead (join.cpp).
  bool sharded = false;
};

}  // namespace hasten::detail
