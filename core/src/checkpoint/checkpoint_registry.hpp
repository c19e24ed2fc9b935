// What the checkpoint subsystem keeps between calls (checkpoint_save.cpp, checkpoint_load.cpp):
// the objects registered for checkpointing, the next automatic checkpoint's number, and
// whether and from where this run resumed.
#pragma once

#include <hasten/detail/engine.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace hasten::detail {

struct CheckpointRegistry {
  std::vector<Engine::CheckpointObject> objects;  // register_for_checkpointing, in order
  int64_t save_iteration = 0;                     // the next automatic checkpoint's number
  // Config `resume`: settled by the first load_state, resumed_from() or start of the loop.
  bool resume_settled = false;
  std::string resumed_from;  // the checkpoint this run continued from ("" if none)
};

}  // namespace hasten::detail
