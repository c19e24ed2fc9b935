// hasten-bench --big-model-save / --big-model-run: big-model inference (hasten/big_modeling.hpp)
// against the same model held whole in memory. A gpt-tiny-shaped model of 100 M parameters
// (width 1024, 8 layers, each a unit; 403 MB in float32) is saved once; each run builds it
// under EmptyWeights, dispatches it (whole: every module on the CPU; offload: a CPU budget,
// the rest of the units on disk), runs forwards under NoGradGuard and prints one JSON line:
// the process's peak RSS, the forward time and a checksum of the logits (equal on both sides).
#pragma once

#include <cstdint>
#include <string>

namespace hasten::bench {

// Writes the model's weights (seed 0) to dir/model.safetensors; prints {"params", "bytes"}.
void big_model_save(const std::string& dir);

// side "whole" or "offload" (budget_mib: the CPU's share of the model's weights).
void big_model_run(const std::string& side, const std::string& dir, double budget_mib);

}  // namespace hasten::bench
