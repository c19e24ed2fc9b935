// Accelerate's strategy vocabulary as the loaded strategy plugins declare it (ABI 1.2): the
// distributed_type values that select each one, and the keys of the config section each
// owns (fsdp_config, deepspeed_config, or a third party's), with the option each key sets.
// The core knows none of these names itself.
#pragma once

#include <hasten/registry.hpp>

#include <map>
#include <string>
#include <vector>

#include "config/config_schema.hpp"

namespace hasten::detail {

struct StrategyVocabulary {
  Schema rows;  // one Section row per config section, one row per section key
  std::map<std::string, std::string> by_distributed_type;  // "FSDP" -> "fsdp"
  std::map<std::string, std::string> section_of;           // strategy -> its config section
};

// Builds the vocabulary of the discovered strategies. Throws ConfigError when a strategy
// claims a section named like one of hasten's own keys.
StrategyVocabulary strategy_vocabulary(const std::vector<PluginInfo>& plugins);

}  // namespace hasten::detail
