// Model weights in Hugging Face's layout: save_model (sharded by size, one unit at a time),
// load_weights and merge_weights.
#include <hasten/error.hpp>
#include <hasten/safetensors.hpp>
#include <hasten/weights.hpp>

#include <nlohmann/json.hpp>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <set>
#include <fstream>
#include <map>

#include "checkpoint/checkpoint_files.hpp"
#include "checkpoint/weight_files.hpp"
#include "engine/engine_state.hpp"
#include "parallel/split_parameters.hpp"

namespace hasten {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

using detail::kIndex;
using detail::kSingle;
using detail::weight_files;

std::string shard_name(size_t k, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", k, n);
  return buf;
}

// Removes the shards of an earlier save into the same directory that this one (`count`
// shards, 0 for a single file) did not overwrite: left in place they would sit next to an
// index that no longer names them.
void remove_stale_shards(const fs::path& dir, size_t count) {
  std::set<std::string> current;
  for (size_t k = 1; k <= count; ++k) current.insert(shard_name(k, count));
  std::vector<fs::path> stale;
  std::error_code ec;
  for (auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool shard = name.rfind("model-", 0) == 0 && name.find("-of-") != std::string::npos &&
                       name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0;
    if (shard && !current.count(name)) stale.push_back(entry.path());
  }
  for (auto& p : stale) fs::remove(p, ec);
}

// Every tensor of the weights at `path`, reading each file once.
NamedTensors read_weights(const fs::path& path, const std::string& who) {
  std::map<fs::path, std::vector<std::string>> by_file;
  for (auto& [name, file] : weight_files(path, who)) by_file[file].push_back(name);
  NamedTensors out;
  for (auto& [file, names] : by_file) {
    std::map<std::string, torch::Tensor> got;
    for (auto& [name, t] : load_safetensors(file.string())) got[name] = t;
    for (auto& name : names) {
      auto it = got.find(name);
      if (it == got.end()) throw Error(who + ": '" + file.string() + "' lacks '" + name + "', which the index lists");
      out.emplace_back(name, it->second);
    }
  }
  return out;
}

}  // namespace

uint64_t parse_size(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  std::string unit = text.substr(i);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  static const std::map<std::string, double> units = {
      {"", 1},           {"B", 1},          {"KB", 1e3},           {"MB", 1e6},          {"GB", 1e9},
      {"TB", 1e12},      {"KIB", 1024.0},   {"MIB", 1048576.0},    {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
  char* end = nullptr;
  const double number = i > 0 ? std::strtod(text.substr(0, i).c_str(), &end) : -1;
  auto it = units.find(unit);
  if (i == 0 || it == units.end() || number <= 0 || number * it->second >= 9.2e18)
    throw Error("max_shard_size: '" + text +
                "' is not a size (allowed: a positive number below 9.2e18 bytes with B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)");
  return static_cast<uint64_t>(number * it->second);
}

void load_weights(torch::nn::Module& module, const std::string& path, bool strict) {
  std::map<std::string, torch::Tensor> weights;
  for (auto& [name, t] : read_weights(path, "load_weights")) weights[name] = t;
  torch::NoGradGuard no_grad;
  std::vector<std::string> missing;
  auto load = [&](const std::string& name, torch::Tensor& target) {
    auto it = weights.find(name);
    if (it == weights.end()) {
      missing.push_back(name);
      return;
    }
    if (it->second.sizes() != target.sizes() && target.numel() == 0 && it->second.numel() > 0)
      throw Error("load_weights: '" + name + "' of the module holds no values (a hasten::Unit built sharded under "
                  "sharded_init keeps them in the strategy until prepare); build the model whole (sharded_init, "
                  "zero3_init_flag and fsdp_cpu_ram_efficient_loading off) to load weights into it");
    if (it->second.sizes() != target.sizes())
      throw Error("load_weights: '" + name + "' has shape " + c10::str(it->second.sizes()) + " in '" + path +
                  "', the module's is " + c10::str(target.sizes()));
    target.copy_(it->second);  // converts the dtype
    weights.erase(it);
  };
  for (auto& named : module.named_parameters()) load(named.key(), named.value());
  for (auto& named : module.named_buffers()) load(named.key(), named.value());
  if (strict && !missing.empty())
    throw Error("load_weights: '" + path + "' has no '" + missing.front() + "'" +
                (missing.size() > 1 ? " (and " + std::to_string(missing.size() - 1) + " more)" : "") +
                ", which the module has (strict; pass strict = false to keep the module's own)");
  if (strict && !weights.empty())
    throw Error("load_weights: '" + path + "' has '" + weights.begin()->first + "'" +
                (weights.size() > 1 ? " (and " + std::to_string(weights.size() - 1) + " more)" : "") +
                ", which the module does not (strict)");
}

void merge_weights(const std::string& path, const std::string& out) {
  save_safetensors(out, read_weights(path, "merge-weights"), {{"format", "pt"}});
}

namespace detail {

void Engine::save_model(size_t model, const std::string& dir, uint64_t max_shard_bytes) {
  Impl& s = *impl_;
  const bool main = s.process.rank == 0;
  const fs::path target(dir);
  std::string failure;
  // Shards are written as they fill, under temporary names (their count is known at the end).
  std::vector<std::pair<std::string, std::vector<std::string>>> shards;  // temp file, names
  NamedTensors pending;
  uint64_t pending_bytes = 0, total = 0;
  auto flush = [&] {
    if (pending.empty() || !failure.empty()) return;
    try {
      const std::string name = ".shard-" + std::to_string(shards.size()) + ".tmp";
      save_safetensors((target / name).string(), pending, {{"format", "pt"}});
      std::vector<std::string> names;
      for (auto& [n, t] : pending) names.push_back(n);
      shards.emplace_back(name, std::move(names));
    } catch (const std::exception& e) {
      failure = e.what();
    }
    pending.clear();
    pending_bytes = 0;
  };
  auto each = [&](const std::string& name, torch::Tensor& value) {
    if (!main || !failure.empty()) return;
    const uint64_t bytes = static_cast<uint64_t>(value.numel()) * value.element_size();
    if (pending_bytes > 0 && pending_bytes + bytes > max_shard_bytes) flush();
    pending.emplace_back(name, value.detach().to(torch::kCPU).clone());
    pending_bytes += bytes;
    total += bytes;
  };
  if (main) {
    std::error_code ec;
    fs::create_directories(target, ec);
    if (ec) failure = "save_model: cannot create '" + dir + "': " + ec.message();
  }
  ModelEntry& m = s.models.at(model);
  if (s.strategy->has_state_dict()) {
    s.strategy->state_dict_each(*m.module, 0, each);  // one unit gathered at a time
  } else {
    // Tensor-parallel parts are gathered whole, every rank taking part; rank 0 writes.
    const SplitLayouts splits = split_layouts(*m.module);
    torch::NoGradGuard no_grad;
    for (auto& named : m.module->named_parameters()) {
      const auto split = splits.find(named.key());
      if (split == splits.end()) {
        each(named.key(), named.value());
        continue;
      }
      torch::Tensor whole = gather_whole(*this, named.value(), split->second);
      each(named.key(), whole);
    }
    for (auto& named : m.module->named_buffers()) each(named.key(), named.value());
  }
  flush();
  if (main && failure.empty()) {
    try {
      std::error_code ec;
      if (shards.size() == 1) {
        fs::rename(target / shards[0].first, target / kSingle);
        fs::remove(target / kIndex, ec);
      } else {
        json map = json::object();
        for (size_t k = 0; k < shards.size(); ++k) {
          const std::string final_name = shard_name(k + 1, shards.size());
          fs::rename(target / shards[k].first, target / final_name);
          for (auto& n : shards[k].second) map[n] = final_name;
        }
        // Last, and whole or not at all: a reader finds the old index or the new one.
        const std::string index = json({{"metadata", {{"total_size", total}}}, {"weight_map", map}}).dump(2) + "\n";
        detail::replace_file(target / kIndex, [&](const detail::ByteSink& sink) { sink(index.data(), index.size()); });
        fs::remove(target / kSingle, ec);
      }
      remove_stale_shards(target, shards.size() == 1 ? 0 : shards.size());
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  if (main && !failure.empty()) {
    // Shards written before the failure, still under their temporary names, are no use.
    std::error_code ignored;
    for (auto& shard : shards) fs::remove(target / shard.first, ignored);
  }
    failure = broadcast(main ? failure : std::string(), 0);
  if (!failure.empty()) throw Error(failure.rfind("save_model", 0) == 0 ? failure : "save_model: " + failure);
}

}  // namespace detail

}  // namespace hasten
