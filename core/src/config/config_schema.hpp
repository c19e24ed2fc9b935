// The configuration's key schema: hasten's and Accelerate's own keys, the rows strategy
// plugins add for their config sections, and the conversion of one value against its key.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace YAML {
class Node;
}

namespace hasten::detail {

enum class KeyType { Bool, Int, Float, String, Enum, StringList, Map, Section, Any };

struct KeySpec {
  std::string path;  // dotted: "mixed_precision", "fsdp_config.fsdp_sharding_strategy"
  KeyType type;
  nlohmann::json def;  // null: no default (unset)
  std::vector<std::string> choices;  // Enum; empty for distributed_type until plugins are known
  std::optional<double> min;
  std::optional<double> max;
  std::string doc;
  bool ignored = false;  // accepted for Accelerate compatibility; no effect in hasten
  // Rows of a strategy's config section (ABI 1.2 option specs with a section_key).
  std::string strategy{};   // the plugin that owns the section, "" for hasten's own keys
  std::string option{};     // the strategy option the key sets, "" when it sets none
  std::string run_setting{};  // the top-level key it also sets, "" when none
};

using Schema = std::vector<KeySpec>;

// hasten's and Accelerate's own keys (no strategy section rows).
const Schema& core_schema();

const KeySpec* find_spec(const Schema& schema, const std::string& path);
// Keys whose parent path is `parent` ("" for the top level).
std::vector<std::string> child_keys(const Schema& schema, const std::string& parent);
// HASTEN_<KEY> with '.' written as "__".
std::string env_name(const std::string& path);
std::string short_type(KeyType t);
// A value as a message shows it: strings bare, the rest as JSON.
std::string show(const nlohmann::json& v);

// Every config source (a file, HASTEN_CONFIG_JSON, a HASTEN_<KEY> variable, a --set or flag
// value) is bounded in nesting and in values after alias expansion: a recursive alias
// (`a: &a [*a]`) would otherwise recurse until the stack overflows, and nested aliases
// ("billion laughs") expand a few hundred bytes into gigabytes. Real configs nest 3 levels
// and hold a few hundred values.
constexpr int kMaxConfigDepth = 64;
constexpr size_t kMaxConfigValues = 100000;

// Scalars of YAML become typed JSON; quoted scalars stay strings. Throws ConfigError naming
// `where` for a mapping that repeats a key, a non-scalar key, or a document past the limits
// above.
nlohmann::json yaml_to_json(const YAML::Node& node, const std::string& where);

// YAML text (a value of the environment, a --set value) parsed and converted as above; a
// syntax error is a ConfigError naming `where` and what is malformed.
nlohmann::json yaml_text_to_json(const std::string& text, const std::string& where);

[[noreturn]] void config_fail(const std::string& where, const std::string& what);

// Converts and checks a value against its key's spec (`v` typed, or a string from the
// environment or YAML); throws ConfigError naming `where`, the key and what is allowed.
nlohmann::json convert(const KeySpec& spec, const nlohmann::json& v, const std::string& where);

}  // namespace hasten::detail
