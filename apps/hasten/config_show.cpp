// `hasten config show [--config_file F] [--set KEY=VALUE]...`: the configuration a run would
// resolve here (defaults < file < environment < flags) and where each value came from.
#include <hasten/config.hpp>
#include <hasten/process.hpp>

#include <nlohmann/json.hpp>

#include <iostream>
#include <memory>

#include "commands.hpp"

namespace hasten::cli {

namespace {

struct ShowFlags {
  std::string config_file;
  std::vector<std::pair<std::string, std::string>> set;
};

int show(const ShowFlags& flags) {
  Options options;
  options.origin = "flag";
  if (!flags.config_file.empty()) options.config_file = flags.config_file;
  options.set = flags.set;
  // As a launch's workers would resolve it (num_processes > 1 decides the strategy).
  const Config config = resolve_as_workers(options, current_environment());
  const nlohmann::json resolved = nlohmann::json::parse(config.resolved_json);
  std::cout << "config file\t" << (config.config_file.empty() ? "(none)" : config.config_file) << "\n"
            << "key\tvalue\tfrom\n";
  // Config::origin names every key the schema gives a default and every key a source set,
  // by its dotted path; the value is looked up in the resolved (nested) JSON.
  for (const auto& [key, from] : config.origin) {
    std::string pointer;
    for (size_t start = 0;;) {
      const size_t dot = key.find('.', start);
      pointer += "/" + key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    const nlohmann::json::json_pointer ptr(pointer);
    if (!resolved.contains(ptr)) continue;
    const auto& v = resolved.at(ptr);
    std::cout << key << "\t" << (v.is_string() ? v.get<std::string>() : v.dump()) << "\t" << from << "\n";
  }
  return 0;
}

}  // namespace

void add_config_show_command(CLI::App& config_cmd, Action& action) {
  auto* cmd = config_cmd.add_subcommand(
      "show", "The resolved config and where each value came from (default, file, env, flag)");
  auto flags = std::make_shared<ShowFlags>();
  cmd->add_option("--config_file,--config-file", flags->config_file, "Config file to read (default: as a run finds it)");
  add_set_option(
      *cmd, [flags](std::string key, std::string value) { flags->set.emplace_back(std::move(key), std::move(value)); },
      "A config key, KEY=VALUE with a YAML value (repeatable), as hasten launch --set");
  cmd->callback([&action, flags] { action = [flags] { return show(*flags); }; });
}

}  // namespace hasten::cli
