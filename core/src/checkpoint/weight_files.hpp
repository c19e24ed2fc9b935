// Where each tensor of a model's weights is: Hugging Face's layout (one model.safetensors, or
// shards with model.safetensors.index.json), a save_state checkpoint (its model.safetensors), or
// one .safetensors file. Shared by load_weights and big-model dispatch, which read the files
// tensor by tensor.
#pragma once

#include <filesystem>
#include <map>
#include <string>

namespace hasten::detail {

inline constexpr const char* kSingle = "model.safetensors";
inline constexpr const char* kIndex = "model.safetensors.index.json";

// name -> file, for every tensor of the weights at `path`, from the files' headers and the
// index (no tensor data is read). Error naming `who` and what is wrong.
std::map<std::string, std::filesystem::path> weight_files(const std::filesystem::path& path, const std::string& who);

}  // namespace hasten::detail
