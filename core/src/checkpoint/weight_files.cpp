// Where a model's weights are (weight_files.hpp).
#include "checkpoint/weight_files.hpp"

#include <hasten/error.hpp>
#include <hasten/safetensors.hpp>

#include <nlohmann/json.hpp>

#include "formats/file_records.hpp"

namespace hasten::detail {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::map<std::string, fs::path> weight_files(const fs::path& path, const std::string& who) {
  std::error_code ec;
  std::map<std::string, fs::path> out;
  if (fs::is_regular_file(path, ec)) {
    for (auto& e : read_safetensors_header(path.string()).tensors) out[e.name] = path;
    return out;
  }
  if (!fs::is_directory(path, ec)) throw Error(who + ": '" + path.string() + "' does not exist");
  if (fs::exists(path / kIndex, ec)) {
    const json index = json::parse(read_file(path / kIndex), nullptr, false);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      throw Error(who + ": '" + (path / kIndex).string() + "' has no weight_map object");
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      // A file beside the index, by plain name: an absolute path or ".." would leave the directory.
      const std::string file = it.value().is_string() ? it.value().get<std::string>() : "";
      if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
        throw Error(who + ": '" + (path / kIndex).string() + "': '" + it.key() + "' maps to " + it.value().dump() +
                    " (allowed: the name of a file beside the index)");
      out[it.key()] = path / file;
    }
    return out;
  }
  if (fs::exists(path / kSingle, ec)) return weight_files(path / kSingle, who);
  throw Error(who + ": '" + path.string() + "' holds neither " + kSingle + " nor " + kIndex);
}

}  // namespace hasten::detail
