// The config as a launch's workers will resolve it (commands.hpp: resolve_as_workers).
#include <hasten/config.hpp>
#include <hasten/process.hpp>

#include "commands.hpp"

namespace hasten::cli {

Config resolve_as_workers(const Options& options, const Environment& env) {
  Config config = resolve_config(options, env);
  // The workers resolve it knowing WORLD_SIZE, which decides the strategy when no source
  // names one (several processes train data-parallel).
  auto named = [&](const std::string& key) {
    const auto it = config.origin.find(key);
    return it != config.origin.end() && it->second != "default" && it->second.rfind("derived", 0) != 0;
  };
  if (config.num_processes > 1 && !named("strategy") && !named("distributed_type") && env.count("WORLD_SIZE") == 0 &&
      env.count("RANK") == 0) {
    Environment as_worker = env;
    as_worker["RANK"] = "0";
    as_worker["WORLD_SIZE"] = std::to_string(config.num_processes);
    config = resolve_config(options, as_worker);
  }
  return config;
}

}  // namespace hasten::cli
