// `hasten plugins` and `hasten plugins inspect FILE`.
#include <hasten/registry.hpp>

#include <iomanip>
#include <iostream>

#include "commands.hpp"

namespace hasten::cli {

namespace {

void print_table(const std::vector<PluginInfo>& plugins) {
  std::cout << std::left << std::setw(10) << "KIND" << std::setw(16) << "NAME" << std::setw(9)
            << "VERSION" << std::setw(6) << "ABI" << std::setw(7) << "TIER" << "FILE\n";
  for (auto& p : plugins) {
    std::cout << std::left << std::setw(10) << to_string(p.kind) << std::setw(16) << p.name
              << std::setw(9) << p.version << std::setw(6)
              << (std::to_string(p.abi_major) + "." + std::to_string(p.abi_minor)) << std::setw(7)
              << p.tier << p.file << "\n";
    for (auto& preset : p.presets)
      std::cout << "  preset " << preset.name << ": " << preset.description << " " << preset.options_json << "\n";
    if (p.kind == PluginKind::Comm) {
      if (!p.serves_declared) {
        std::cout << "  serves: (not declared: selectable by name only, never under comm: auto)\n";
        continue;
      }
      std::string devices;
      for (int d : p.serves_device_types)
        devices += (devices.empty() ? "" : ", ") + std::string(d == 1 ? "cpu" : d == 2 ? "cuda" : std::to_string(d));
      std::cout << "  serves: " << devices << (p.serves_any_machines ? "; ranks on any machines" : "; ranks on one machine")
                << "; priority " << p.serves_priority << "\n";
    }
  }
}

}  // namespace

void add_plugins_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("plugins", "List discovered plugins (kind, name, version, ABI, tier, file)");
  cmd->callback([&action] {
    if (action) return;  // `inspect` already chose the action
    action = []() -> int {
      auto& registry = PluginRegistry::instance();
      print_table(registry.plugins());
      const auto refusals = registry.refusals();
      if (!refusals.empty()) std::cout << "refused:\n";
      for (auto& r : refusals)
        std::cout << "  " << r.file << (r.plugin.empty() ? "" : " [" + r.plugin + "]") << ": " << r.reason << "\n";
      return 0;
    };
  });
  auto* inspect = cmd->add_subcommand("inspect", "Load one plugin library and say whether it is valid, and why not");
  auto file = std::make_shared<std::string>();
  inspect->add_option("FILE", *file, "Plugin library (.so)")->required();
  inspect->callback([&action, file] {
    action = [file]() -> int {
      const InspectResult result = PluginRegistry::instance().inspect(*file);
      if (!result.plugins.empty()) print_table(result.plugins);
      for (auto& r : result.refusals)
        std::cerr << "hasten: error: " << *file << (r.plugin.empty() ? "" : " [" + r.plugin + "]")
                  << " is not a valid hasten plugin: " << r.reason << std::endl;
      if (result.valid) std::cout << *file << ": valid hasten plugin library (ABI 1)\n";
      return result.valid ? 0 : 1;
    };
  });
}

}  // namespace hasten::cli
