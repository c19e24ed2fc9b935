// Big-model inference, Accelerate's big_modeling (infer_auto_device_map,
// load_checkpoint_and_dispatch): a model's weights read from a checkpoint straight to where a
// device map puts them, and the units that do not fit kept on disk, read in for each forward
// and dropped after it, so a model larger than memory runs with one such unit in memory at a
// time. No Accelerator is needed.
//
//   std::shared_ptr<Net> net;
//   { hasten::EmptyWeights empty; net = std::make_shared<Net>(); }  // its blocks are hasten::Unit modules
//   auto map = hasten::infer_auto_device_map(*net, {{"cpu", 2'000'000'000}});
//   hasten::load_checkpoint_and_dispatch(*net, "weights/", map);  // save_model's layout
//   torch::NoGradGuard no_grad;
//   auto logits = net->forward(tokens);    // "disk" units read their weights as they run
//
// Devices: "cpu", "cuda" (cuda:0), "cuda:N", and "disk" for hasten::Unit modules (a unit is
// what can tell when it runs, unit.hpp). With a GPU in the map, the first one is the main device
// (Accelerate's dispatch_model): each outermost unit runs on its GPU, or the main one when it is
// mapped to "cpu" (offloaded: its weights copied in for each forward) or "disk", and moves its
// forward's tensor arguments there; parameters outside units stay where the map puts them.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace hasten {

// Accelerate's init_empty_weights, for units: while one lives on this thread, every hasten::Unit
// constructed keeps no weights once its constructor returns (its parameters and buffers become
// 0-element tensors of their dtype; load_checkpoint_and_dispatch knows their shapes), so a model
// larger than memory is built one unit at a time. Parameters outside every unit are built whole.
// Not under an Accelerator building a model sharded (sharded_init), which the units obey first.
class EmptyWeights {
 public:
  EmptyWeights();
  ~EmptyWeights();
  EmptyWeights(const EmptyWeights&) = delete;
  EmptyWeights& operator=(const EmptyWeights&) = delete;
};

// A module of the model (its name as named_modules() gives it, "" for the root) and its device.
// A parameter or buffer goes where its innermost listed module goes.
struct DevicePlacement {
  std::string module;
  std::string device;  // "cpu", "cuda", "cuda:N" or "disk"
};
using DeviceMap = std::vector<DevicePlacement>;

// The model's units (the outermost hasten::Unit modules, in order) placed on the devices of
// `max_memory` in order: each unit goes to the current device while its parameters and buffers
// fit what is left there, else the current device becomes the next one (Accelerate's rule: a
// device is not returned to); the units left when the devices are used up go to "disk". The
// parameters outside every unit stay with the root on the first device. UsageError for an empty
// or unknown device (allowed: "cpu", "cuda", "cuda:N" of this machine).
DeviceMap infer_auto_device_map(torch::nn::Module& model,
                                const std::vector<std::pair<std::string, uint64_t>>& max_memory);

// Reads the weights at `checkpoint` (a .safetensors file, a directory in save_model's layout, or
// a save_state checkpoint) into the model (built whole, or under EmptyWeights) by `map`, after
// checking all of it, one tensor at a time: modules on a GPU or "cpu" get their values now,
// units on "disk" (and, with a GPU in the map, units on "cpu") read theirs before each forward
// (which must run under torch::NoGradGuard) and drop them after. Strict: every parameter and
// buffer of the model must be in the checkpoint with its shape (dtype converted), and nothing
// else. Errors (one line each): a map that names a module the model lacks, a device other than
// "cpu", "disk", "cuda", "cuda:N" or a GPU this machine lacks, "disk" for a module that is not a
// unit, a unit prepared by an Accelerator or dispatched already, a module listed twice, a tensor
// no listed module holds, a tied tensor streamed with one of its modules only or placed on two
// devices. A dispatched model serves one forward at a time, and Accelerator::prepare refuses it.
void load_checkpoint_and_dispatch(torch::nn::Module& model, const std::string& checkpoint, const DeviceMap& map);

}  // namespace hasten
