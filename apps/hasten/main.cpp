// hasten: environment report, plugin listing and inspection, config files, the launcher,
// merging sharded weights, the self-test and the memory estimate.
#include <hasten/error.hpp>

#include <iostream>

#include "../error_line.hpp"
#include "commands.hpp"

namespace hasten::cli {
int report_error(const std::string& message) {
  std::cerr << "hasten: error: " << message << std::endl;
  return 1;
}

CLI::Option* add_set_option(CLI::App& cmd, std::function<void(std::string key, std::string value)> add,
                            const std::string& help) {
  return cmd
      .add_option_function<std::vector<std::string>>(
          "--set",
          [add = std::move(add)](const std::vector<std::string>& items) {
            for (const auto& kv : items) {
              const auto eq = kv.find('=');
              if (eq == std::string::npos || eq == 0)
                throw CLI::ValidationError("--set", "expected KEY=VALUE (a config key, docs/config.md), got '" + kv + "'");
              add(kv.substr(0, eq), kv.substr(eq + 1));
            }
          },
          help)
      ->type_name("KEY=VALUE")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}
}  // namespace hasten::cli

int main(int argc, char** argv) {
  using namespace hasten::cli;
  CLI::App app{"hasten: distributed training for LibTorch C++ programs"};
  app.name("hasten");
  app.require_subcommand(1);
  Action action;
  add_env_command(app, action);
  add_plugins_command(app, action);
  add_config_command(app, action);
  add_launch_command(app, action);
  add_weights_command(app, action);
  add_test_command(app, action);
  add_estimate_memory_command(app, action);
  if (argc > 1 && argv[1][0] != '-') {
    const std::string command = argv[1];
    bool known = false;
    for (auto* sub : app.get_subcommands({})) known = known || sub->get_name() == command;
    if (!known) {
      std::cerr << "hasten: error: unknown command '" << command
                << "' (allowed: env, plugins, config, launch, merge-weights, test, estimate-memory; see hasten --help)" << std::endl;
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "hasten: error: " << e.what() << " (see hasten --help)" << std::endl;
    return 2;
  }
  try {
    return action ? action() : 0;
  } catch (const std::exception& e) {
    return report_error(error_line(e));
  }
}
