// The state file of a checkpoint (hasten_state.json), checked before use: every key loading
// reads, with its type, range and the lengths arrays must agree on, so that what follows
// indexes only what exists. No LibTorch here.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace hasten::detail {

// Throws hasten::Error with one line ("load_state: '<path>' is malformed: <key> must be ...").
void validate_state(const nlohmann::json& state, const std::string& path);

}  // namespace hasten::detail
