// The config key `parallelism_config` (Accelerate's ParallelismConfig, spelled as its config
// files write it) read into ParallelismConfig. Checked against the number of processes later,
// where the run knows it (mesh_layout.hpp).
#pragma once

#include <hasten/config.hpp>

#include <nlohmann/json.hpp>

#include <string>

namespace hasten::detail {

// `where` names the key's source for messages ("parallelism_config (file F)"). Fields:
// parallelism_config_{dp_replicate,dp_shard,tp,cp}_size, integers >= 1 (cp: 1 only, until context
// parallelism exists). Throws ConfigError with one line for an unknown field or a bad value.
ParallelismConfig parse_parallelism(const nlohmann::json& value, const std::string& where);

}  // namespace hasten::detail
