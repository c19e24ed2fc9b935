// Strategies' readers of their own config file formats (plugin_config_file.h): the core only
// routes a file to the reader of the strategy that owns the format and takes back config keys.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

namespace hasten::detail {

struct NativeConfig {
  nlohmann::json values;  // config keys, as the reader translated them
  std::string strategy;   // the strategy whose reader it was
  std::string format;     // "DeepSpeed JSON"
};

// Offers `path` to every discovered strategy's reader; the first that recognizes the file
// translates it. nullopt: none does (a hasten or Accelerate config file). Throws ConfigError
// when a reader recognizes the file and refuses it.
std::optional<NativeConfig> read_native_config(const std::string& path);

// The section key through which `strategy`'s reader takes a file ("deepspeed_config_file"),
// "" when it has no reader or the reader takes none.
std::string reader_section_key(const std::string& strategy);

// Reads `path` with `strategy`'s reader (a file a section key names); `where` says which key
// named it. Throws ConfigError when the file is not in the reader's format or is refused.
NativeConfig read_strategy_config_file(const std::string& strategy, const std::string& path, const std::string& where);

}  // namespace hasten::detail
