// The config key `parallelism_config`, checked field by field (see parallelism_config.hpp).
#include "config/parallelism_config.hpp"

#include <hasten/error.hpp>

#include <cstdlib>

namespace hasten::detail {

using json = nlohmann::json;

namespace {

constexpr const char* kAllowed =
    "parallelism_config_dp_replicate_size, parallelism_config_dp_shard_size, parallelism_config_tp_size, "
    "parallelism_config_cp_size, parallelism_config_sp_size and the context/sequence-parallel settings "
    "Accelerate writes beside them (parallelism_config_cp_comm_strategy, _cp_backend, _sp_backend, _sp_seq_length, "
    "_sp_seq_length_is_variable, _sp_attn_implementation)";

// A size: a whole number from 1 to 1,000,000; a string of one (an environment or a quoted YAML
// value) counts.
int size_of(const json& v, const std::string& where, const std::string& key) {
  int64_t n = 0;
  bool ok = false;
  if (v.is_number_integer()) {
    n = v.get<int64_t>();
    ok = true;
  } else if (v.is_string() && !v.get<std::string>().empty()) {
    const std::string& text = v.get_ref<const std::string&>();
    char* end = nullptr;
    n = std::strtoll(text.c_str(), &end, 10);
    ok = end != nullptr && *end == '\0';
  }
  if (!ok || n < 1 || n > 1000000)
    throw ConfigError("config error: " + where + ": " + key + " must be a whole number from 1 to 1000000, got '" +
                      (v.is_string() ? v.get<std::string>() : v.dump()) + "'");
  return static_cast<int>(n);
}

}  // namespace

ParallelismConfig parse_parallelism(const json& value, const std::string& where) {
  ParallelismConfig p;
  if (value.is_null() || (value.is_object() && value.empty())) return p;
  if (!value.is_object())
    throw ConfigError("config error: " + where + ": expected a mapping of " + kAllowed + ", got '" + value.dump() + "'");
  for (auto it = value.begin(); it != value.end(); ++it) {
    const std::string& key = it.key();
    if (key == "parallelism_config_dp_replicate_size") {
      p.dp_replicate_size = size_of(it.value(), where, key);
    } else if (key == "parallelism_config_dp_shard_size") {
      p.dp_shard_size = size_of(it.value(), where, key);
    } else if (key == "parallelism_config_tp_size") {
      p.tp_size = size_of(it.value(), where, key);
    } else if (key == "parallelism_config_cp_size") {
      p.cp_size = size_of(it.value(), where, key);
      if (p.cp_size != 1)
        throw ConfigError("config error: " + where + ": parallelism_config_cp_size " + std::to_string(p.cp_size) +
                          " needs context parallelism, which hasten does not have yet (allowed: 1)");
    } else if (key == "parallelism_config_sp_size") {
      if (const int sp = size_of(it.value(), where, key); sp != 1)
        throw ConfigError("config error: " + where + ": parallelism_config_sp_size " + std::to_string(sp) +
                          " needs sequence parallelism, which hasten does not have yet (allowed: 1)");
    } else if (key == "parallelism_config_cp_comm_strategy") {
      // Accelerate writes it (default allgather) whatever cp_size is; it matters only with cp > 1.
      const json& v = it.value();
      if (!v.is_string() || (v.get<std::string>() != "allgather" && v.get<std::string>() != "alltoall"))
        throw ConfigError("config error: " + where + ": parallelism_config_cp_comm_strategy must be allgather or "
                          "alltoall, got '" + (v.is_string() ? v.get<std::string>() : v.dump()) + "'");
    } else if (key == "parallelism_config_cp_backend" || key == "parallelism_config_sp_backend" ||
               key == "parallelism_config_sp_seq_length" || key == "parallelism_config_sp_seq_length_is_variable" ||
               key == "parallelism_config_sp_attn_implementation") {
      // Settings of context and sequence parallelism, which matter only with cp or sp above 1:
      // refused above, so these change nothing a run does (as in Accelerate with sizes of 1).
    } else {
      throw ConfigError("config error: " + where + ": unknown field '" + key + "' (allowed: " + kAllowed + ")");
    }
  }
  return p;
}

}  // namespace hasten::detail
