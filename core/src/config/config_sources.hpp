// The configuration's sources, each read into one layer: a YAML file, the environment
// (HASTEN_CONFIG_JSON and HASTEN_<KEY> variables) and options given in code.
#pragma once

#include <hasten/config.hpp>

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

#include "config/config_schema.hpp"

namespace hasten::detail {

// A key that hasten's own schema does not know: a strategy's config section may (plugins
// are loaded only once plugin_path is known), else it is an error named once they are.
struct PendingKey {
  enum class Source { Tree, Env, Set };
  Source source;
  std::string path;      // dotted key (Env: spelled from the variable's name)
  nlohmann::json value;  // Tree: the key's subtree; Env and Set: the value as written
  std::string where;     // how messages name the source: "file 'F'", "code options"
  std::string origin;    // what Config::origin records
  std::string env;       // Env: the variable
};

struct Layer {
  std::string label;                           // "file X", "environment", "code"
  nlohmann::json values = nlohmann::json::object();  // dotted key -> value (validated)
  std::map<std::string, std::string> origin;   // dotted key -> where exactly
  std::vector<PendingKey> pending;
};

Layer file_layer(const std::string& path);
// A tree of config keys that a source other than a YAML file produced (a strategy's reader of
// its own file format), validated like a file's.
Layer tree_layer(const nlohmann::json& tree, const std::string& label, const std::string& where,
                 const std::string& origin);
Layer env_layer(const Environment& env);
Layer code_layer(const Options& o);

// Validates the layer's pending keys against the full schema (hasten's keys and the loaded
// strategies' sections) and adds them to its values; throws ConfigError for a key no one
// knows, with a near match.
void resolve_pending(Layer& layer, const Schema& full);

}  // namespace hasten::detail
