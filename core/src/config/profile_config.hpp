// The config key `profile` (a mapping {wait, warmup, active, dir}) read into ProfileSettings.
// No LibTorch here: the profiler itself is core/src/engine/profiling.cpp.
#pragma once

#include <hasten/config.hpp>

#include <nlohmann/json.hpp>

#include <string>

namespace hasten::detail {

// `where` names the key's source for messages ("profile (file F)"). An empty mapping is the
// profiler off. Throws ConfigError with one line for an unknown field or a value out of range.
ProfileSettings parse_profile(const nlohmann::json& value, const std::string& where);

}  // namespace hasten::detail
