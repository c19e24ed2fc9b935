// hasten_state.json checked key by key before a load reads any of it (checkpoint_state_check.hpp).
#include "checkpoint/checkpoint_state_check.hpp"

#include <hasten/error.hpp>

#include <cstdint>
#include <limits>

namespace hasten::detail {

using json = nlohmann::json;

// Checks every key of hasten_state.json that loading reads, with its type and the sizes the
// arrays must agree on, so that what follows indexes only what exists: a hand-edited or
// crafted file is one line naming the key, never a read of a missing one.
void validate_state(const json& st, const std::string& path) {
  auto bad = [&](const std::string& key, const std::string& want) {
    return Error("load_state: '" + path + "' is malformed: " + key + " must be " + want);
  };
  if (!st.is_object()) throw Error("load_state: '" + path + "' is malformed: not a JSON object");
  auto integer = [&](const json& parent, const char* key, const std::string& where, int64_t lo, int64_t hi) {
    if (!parent.contains(key) || !parent[key].is_number_integer() || parent[key].get<int64_t>() < lo ||
        parent[key].get<int64_t>() > hi)
      throw bad(where + key, "an integer from " + std::to_string(lo) + " to " + std::to_string(hi));
  };
  auto array = [&](const json& parent, const char* key, const std::string& where) -> const json& {
    if (!parent.contains(key) || !parent[key].is_array()) throw bad(where + key, "an array");
    return parent[key];
  };
  constexpr int64_t kBig = int64_t{1} << 53;
  integer(st, "world_size", "", 1, 1 << 24);
  if (st.contains("tp_size")) integer(st, "tp_size", "", 1, 1 << 24);
  if (!st.contains("strategy") || !st["strategy"].is_string()) throw bad("strategy", "a string");
  integer(st, "models", "", 0, 1 << 16);
  if (st.contains("precision")) {
    const json& p = st["precision"];
    if (!p.is_object() || !p.contains("plugin") || !p["plugin"].is_string() || !p.contains("state") ||
        !p["state"].is_object())
      throw bad("precision", "an object {\"plugin\": a name, \"state\": an object}");
  }
  if (!st.contains("optimizers") || !st["optimizers"].is_object()) throw bad("optimizers", "an object");
  const json& opt = st["optimizers"];
  integer(opt, "count", "optimizers.", 0, 1 << 16);
  const auto count = static_cast<size_t>(opt["count"].get<int64_t>());
  for (const char* key : {"layouts", "types", "lr"}) {
    const json& a = array(opt, key, "optimizers.");
    if (a.size() != count) throw bad(std::string("optimizers.") + key, "an array of optimizers.count entries");
  }
  for (const json& l : opt["layouts"])
    if (!l.is_string() || (l != "portable" && l != "per_rank" && l != "full"))
      throw bad("optimizers.layouts[]", "\"portable\", \"per_rank\" or \"full\"");
  for (const json& t : opt["types"])
    if (!t.is_string()) throw bad("optimizers.types[]", "a string");
  for (const json& groups : opt["lr"]) {
    if (!groups.is_array()) throw bad("optimizers.lr[]", "an array of numbers");
    for (const json& lr : groups)
      if (!lr.is_number()) throw bad("optimizers.lr[][]", "a number");
  }
  const json& schedulers = array(st, "schedulers", "");
  for (const json& n : schedulers)
    if (!n.is_number_integer() || n.get<int64_t>() < 0 || n.get<int64_t>() > kBig) throw bad("schedulers[]", "a step count");
  if (st.contains("scheduler_adjustments")) {
    const json& adj = array(st, "scheduler_adjustments", "");
    if (adj.size() != schedulers.size()) throw bad("scheduler_adjustments", "an array as long as schedulers");
    for (const json& n : adj)
      if (!n.is_number_integer()) throw bad("scheduler_adjustments[]", "an integer");
  }
  for (const json& l : array(st, "loaders", "")) {
    if (!l.is_object()) throw bad("loaders[]", "an object");
    if (l.contains("world_size")) integer(l, "world_size", "loaders[].", 1, 1 << 24);
    for (const char* key : {"epoch", "next_batch", "batch_size"})
      if (l.contains(key)) integer(l, key, "loaders[].", 0, kBig);
    for (const char* key : {"num_batches", "dataset_size"})  // -1 or the maximum: a stream of unknown length
      if (l.contains(key)) integer(l, key, "loaders[].", -1, std::numeric_limits<int64_t>::max());
  }
  for (const json& c : array(st, "custom", ""))
    if (c != "tensors" && c != "bytes") throw bad("custom[]", "\"tensors\" or \"bytes\"");
  if (!st.contains("accumulation") || !st["accumulation"].is_object()) throw bad("accumulation", "an object");
  integer(st["accumulation"], "step", "accumulation.", 0, kBig);
  integer(st["accumulation"], "window", "accumulation.", 1, kBig);
}

}  // namespace hasten::detail
