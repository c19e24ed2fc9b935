// The subcommands of `hasten`. Each registers its options on the app and returns the action
// that runs it; actions return the process exit status and report errors as one line.
#pragma once

#include <hasten/config.hpp>
#include <hasten/process.hpp>

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

namespace hasten::cli {

using Action = std::function<int()>;

void add_env_command(CLI::App& app, Action& action);
void add_plugins_command(CLI::App& app, Action& action);
void add_config_command(CLI::App& app, Action& action);
// Parts of `hasten config`, registered on its subcommand by add_config_command.
void add_config_wizard(CLI::App& config_cmd, Action& action);
void add_config_show_command(CLI::App& config_cmd, Action& action);
void add_launch_command(CLI::App& app, Action& action);
void add_weights_command(CLI::App& app, Action& action);
void add_test_command(CLI::App& app, Action& action);
void add_estimate_memory_command(CLI::App& app, Action& action);

// The config as the workers of a launch on this machine resolve it: they know WORLD_SIZE,
// which decides the strategy when no source names one (launch, test and config show agree).
Config resolve_as_workers(const Options& options, const Environment& env);

// "hasten: error: <message>" on stderr; returns 1.
int report_error(const std::string& message);

// `--set KEY=VALUE` (repeatable), any config key from the command line, as launch, test and
// config show take it: each pair goes to `add`; a word without '=' is a usage error.
CLI::Option* add_set_option(CLI::App& cmd, std::function<void(std::string key, std::string value)> add,
                            const std::string& help);

}  // namespace hasten::cli
