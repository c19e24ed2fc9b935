// A checkpoint's optimizer state: the portable layout (state tensors by parameter name, in
// pieces, that loads on any number of ranks under any strategy) and, for optimizer types
// hasten cannot read, LibTorch's own archive.
#pragma once

#include <hasten/safetensors.hpp>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "engine/strategy_instance.hpp"

namespace hasten::detail {

class Engine;

// The optimizer's type, as a checkpoint records it ("Adam", "SGD", ...).
std::string optimizer_type(torch::optim::Optimizer& optimizer);

// LibTorch's archive of the optimizer, and loading one (Error naming `file` when it does not fit).
std::string optimizer_bytes(torch::optim::Optimizer& optimizer);
void load_optimizer_bytes(torch::optim::Optimizer& optimizer, const std::string& bytes, const std::string& file);

// This rank's optimizer state of model `m`'s parameters in the portable layout (plugin.h,
// strategy slot optimizer_state), names prefixed with "<m>:". Throws sdk::Error (unsupported)
// or PluginError for an optimizer type whose state cannot be read. Unsharded, rank 0 gives
// the state and the others nothing; the state of tensor-parallel parts is gathered whole
// (split_parameters.hpp), so then every rank must call it.
NamedTensors optimizer_pieces(Engine& engine, StrategyInstance& strategy, int rank, torch::optim::Optimizer& optimizer,
                              torch::nn::Module& module, size_t m);

// The pieces of every saved rank's file (file name for errors, its tensors), assembled into
// full state per model: model -> ("<param>/<key>", 1-D tensor or 0-d scalar).
std::map<size_t, NamedTensors> assemble_optimizer(const std::vector<std::pair<std::string, NamedTensors>>& files);

// Sets the optimizer state of the model's own parameters from full state (unsharded); a
// tensor-parallel part takes its part of the whole state.
void set_optimizer_state(torch::optim::Optimizer& optimizer, torch::nn::Module& module, const NamedTensors& full);

// Sets the step count of the parameter states that own the given state tensors (one of a
// state's tensors has the tensor's storage): after a load that read the state tensors in place,
// the integer step is the one thing left to set. SGD keeps no step.
void set_steps(torch::optim::Optimizer& optimizer, const std::vector<std::pair<torch::Tensor, int64_t>>& steps);

}  // namespace hasten::detail
