// The names of a checkpoint's files, which save_state (checkpoint_save.cpp) writes and
// load_state (checkpoint_load.cpp) reads: the one place where the two must agree.
// docs/checkpoints.md describes each file. No LibTorch here.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>

namespace hasten::detail::checkpoint_layout {

// The first of each kind has no index (model.safetensors), the others "_<i>" (model_1...).
inline std::string indexed(const std::string& stem, size_t i, const std::string& ext) {
  return stem + (i == 0 ? "" : "_" + std::to_string(i)) + ext;
}
inline std::string model_file(size_t i) { return indexed("model", i, ".safetensors"); }
// LibTorch's own archive of an optimizer type hasten cannot read: one file when every rank
// holds the same state (rank < 0), else one per rank.
inline std::string optimizer_file(size_t i, int rank) {
  return indexed("optimizer", i, rank < 0 ? ".bin" : ".rank" + std::to_string(rank) + ".bin");
}
// The portable layout: each rank's optimizer state pieces (optimizer_state.hpp).
inline std::string optimizer_pieces_file(size_t i, int rank) {
  return indexed("optimizer", i, ".rank" + std::to_string(rank) + ".safetensors");
}
// Gradients accumulated so far, when saved in the middle of an accumulation window.
inline std::string gradients_file(size_t i, int rank) {
  return indexed("gradients", i, ".rank" + std::to_string(rank) + ".safetensors");
}
inline std::string rng_file(int rank) { return "random_states_" + std::to_string(rank) + ".safetensors"; }
inline std::string custom_file(size_t i, bool tensors) {
  return "custom_checkpoint_" + std::to_string(i) + (tensors ? ".safetensors" : ".bin");
}
// Everything else a run needs to continue (counts, positions, layouts), as JSON.
constexpr const char* kState = "hasten_state.json";

// Where automatic checkpoints go: <project_dir>/checkpoints/checkpoint_<N>.
inline std::filesystem::path checkpoints_dir(const std::string& project_dir) {
  return std::filesystem::path(project_dir) / "checkpoints";
}

}  // namespace hasten::detail::checkpoint_layout
