// Options checked against what a plugin describes (ABI 1.2 hasten_option_spec): the host
// refuses an unknown key, a value of the wrong type, a name not allowed or a number out of
// range before the plugin's create() runs, and prints the description.
#pragma once

#include <hasten/registry.hpp>

#include <nlohmann/json.hpp>

#include <string>

namespace hasten::detail {

// Why `value` does not fit `spec` ("expected an integer, got \"x\"", "'X' is not allowed
// (allowed: A, B); did you mean 'A'?", "5 is out of range (allowed: 0 to 3)"), or "".
std::string option_value_error(const PluginOption& spec, const nlohmann::json& value);

// "<plugin> options: ..." naming the first key that is unknown or does not fit, or "" when
// every key fits (or the plugin describes nothing).
std::string described_options_error(const PluginInfo& plugin, const nlohmann::json& options);

// "0 to 3", ">= 0", "FULL_SHARD, NO_SHARD", "" (for messages and `hasten plugins describe`).
std::string allowed_text(const PluginOption& spec);

}  // namespace hasten::detail
