// What the checkpoint subsystem keeps between calls (checkpoint_save.cpp, checkpoint_load.cpp):
// the objects registered for checkpointing, the next automatic checkpoint's number, and
// whether and from where this run resumed.
#pragma once

#include <hasten/detail/engine.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace hasten::detail {

struct CheckpointRegistry {
  std::vector<Engine::CheckpointObject> objects;  // register_for_checkpointing, in order
  int64_t save_iteration = 0;                     // the next automatic checkpoint's number
  // Config `resume`: settled by the first load_state, resumed_from() or start of the loop.
  bool resume_settled = false;
  std::string resumed_from;  // the checkpoint this run continued from ("" if none)
  // register_save_state_pre_hook / register_load_state_pre_hook, by id, in registration order.
  std::map<size_t, StateHook> save_pre_hooks, load_pre_hooks;
  size_t next_hook_id = 0;
};

}  // namespace hasten::detail
