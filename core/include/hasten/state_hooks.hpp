// Hooks that run at the start of save_state and load_state (Accelerate's
// register_save_state_pre_hook and register_load_state_pre_hook).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace hasten {

// What a pre-hook sees, on every rank. Accelerate's hooks get (models, weights, output_dir)
// and (models, input_dir) and may pop models to save or load those themselves; here `models`
// holds the indices (PreparedModel::index()) of the prepared models whose weights the call
// writes or reads, and a hook may erase some. Every rank's hooks must leave the same list (the
// weights are gathered collectively): save_state and load_state refuse lists that differ.
struct StateHookArgs {
  // save_state: the checkpoint's staging directory, which becomes the checkpoint when every
  // rank has written (files a hook writes there are part of it, all or nothing); load_state:
  // the checkpoint being read.
  std::string dir;
  std::vector<size_t> models;
};
using StateHook = std::function<void(StateHookArgs&)>;

// A registered hook; remove() unregisters it (Accelerate's RemovableHandle). Dropping the
// handle keeps the hook registered; remove() after the Accelerator is gone does nothing.
class HookHandle {
 public:
  HookHandle() = default;
  explicit HookHandle(std::function<void()> remove) : remove_(std::make_shared<std::function<void()>>(std::move(remove))) {}
  void remove() {
    if (remove_ && *remove_) {
      (*remove_)();
      *remove_ = nullptr;
    }
  }

 private:
  std::shared_ptr<std::function<void()>> remove_;
};

}  // namespace hasten
