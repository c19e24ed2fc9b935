// `hasten plugins`, `hasten plugins inspect FILE...` and `hasten plugins describe NAME`.
#include <hasten/error.hpp>
#include <hasten/registry.hpp>

#include <iomanip>
#include <iostream>
#include <sstream>

#include "commands.hpp"

namespace hasten::cli {

namespace {

// What a comm plugin serves, as `hasten plugins` and `describe` print it.
std::string serves_line(const PluginInfo& p) {
  std::string devices;
  for (int d : p.serves_device_types)
    devices += (devices.empty() ? "" : ", ") + std::string(d == 1 ? "cpu" : d == 2 ? "cuda" : std::to_string(d));
  return "  serves: " + devices + (p.serves_any_machines ? "; ranks on any machines" : "; ranks on one machine") +
         "; priority " + std::to_string(p.serves_priority) + "\n";
}

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
      std::cout << serves_line(p);
    }
  }
}

std::string allowed_text(const PluginOption& o) {
  auto num = [](double d) {
    std::ostringstream s;
    s << d;
    return s.str();
  };
  if (o.type == "enum") {
    std::string all;
    for (auto& a : o.allowed) all += (all.empty() ? "" : ", ") + a;
    return all;
  }
  if (o.min && o.max) return num(*o.min) + " to " + num(*o.max);
  if (o.min) return ">= " + num(*o.min);
  if (o.max) return "<= " + num(*o.max);
  return "";
}

std::string options_key(PluginKind kind) {
  switch (kind) {
    case PluginKind::Strategy: return "strategy_options";
    case PluginKind::Precision: return "precision_options";
    case PluginKind::Tracker: return "tracker_options.<name>";
    case PluginKind::Comm: return "comm_options";
  }
  return "options";
}

// What a plugin declares: its selection names, its vocabulary and its options. With
// markdown, only the options table, as docs/config.md carries it.
void describe(const PluginInfo& p, bool markdown) {
  const std::string section = p.config_section.empty() ? "" : p.config_section + ".";
  if (!markdown) {
    std::cout << to_string(p.kind) << " " << p.name << " " << p.version << " (ABI " << p.abi_major << "." << p.abi_minor
              << ", " << p.tier << " tier): " << p.description << "\n  file: " << p.file << "\n";
    if (!p.distributed_types.empty()) {
      std::string all;
      for (auto& t : p.distributed_types) all += (all.empty() ? "" : ", ") + t;
      std::cout << "  selected by distributed_type: " << all << "\n";
    }
    if (!p.config_section.empty()) std::cout << "  config section: " << p.config_section << "\n";
    if (p.kind == PluginKind::Comm && p.serves_declared) {
      std::cout << serves_line(p);
    }
    for (auto& preset : p.presets)
      std::cout << "  preset " << preset.name << ": " << preset.description << " " << preset.options_json << "\n";
    if (!p.options_described) {
      std::cout << "  options: not described (the plugin checks " << options_key(p.kind) << " itself)\n";
      return;
    }
    if (p.options.empty()) {
      std::cout << "  options: none (" << options_key(p.kind) << " must be empty)\n";
      return;
    }
    std::cout << "  options (" << options_key(p.kind) << "):\n";
  }
  if (p.options.empty()) return;
  std::cout << "| option | " << (section.empty() ? "" : "config key | ") << "type | default | allowed | meaning |\n"
            << "| --- | " << (section.empty() ? "" : "--- | ") << "--- | --- | --- | --- |\n";
  for (auto& o : p.options) {
    std::cout << "| " << (o.name.empty() ? "(none)" : "`" + o.name + "`") << " | ";
    if (!section.empty()) std::cout << (o.section_key.empty() ? "" : "`" + section + o.section_key + "`") << " | ";
    std::cout << o.type << " | " << (o.default_json.empty() ? "" : "`" + o.default_json + "`") << " | "
              << allowed_text(o) << " | " << o.help
              << (o.run_setting.empty() ? "" : " (also sets " + o.run_setting + ")") << " |\n";
  }
}

}  // namespace

void add_plugins_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("plugins", "List discovered plugins (kind, name, version, ABI, tier, file)");
  cmd->callback([&action] {
    if (action) return;  // `inspect` or `describe` already chose the action
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
  auto* desc = cmd->add_subcommand("describe", "What a plugin declares: selection names, config section, options");
  auto name = std::make_shared<std::string>();
  auto markdown = std::make_shared<bool>(false);
  desc->add_option("NAME", *name, "Plugin or preset name, or a path to a plugin library")->required();
  desc->add_flag("--markdown", *markdown, "Print only the options table, as docs/config.md carries it");
  desc->callback([&action, name, markdown] {
    action = [name, markdown]() -> int {
      auto& registry = PluginRegistry::instance();
      std::vector<PluginInfo> found;
      for (auto kind : {PluginKind::Strategy, PluginKind::Precision, PluginKind::Tracker, PluginKind::Comm}) {
        try {
          found.push_back(*registry.select(kind, *name).info);
        } catch (const Error&) {  // not of this kind
        }
      }
      if (found.empty()) {
        std::vector<std::string> names;
        for (auto& p : registry.plugins()) names.push_back(p.name);
        std::string all;
        for (auto& n : names) all += (all.empty() ? "" : ", ") + n;
        const std::string near = registry.nearest_name(*name);
        std::cerr << "hasten: error: no plugin or preset named '" << *name << "' (installed: " << all << ")"
                  << (near.empty() ? "" : "; did you mean '" + near + "'?") << std::endl;
        return 1;
      }
      for (auto& p : found) describe(p, *markdown);
      return 0;
    };
  });
  auto* inspect = cmd->add_subcommand(
      "inspect", "Probe plugin libraries (in a child process first) and say whether each is valid, and why not");
  auto files = std::make_shared<std::vector<std::string>>();
  inspect->add_option("FILE", *files, "Plugin libraries (.so); each gets its verdict")->required();
  inspect->callback([&action, files] {
    action = [files]() -> int {
      int invalid = 0;
      for (const auto& file : *files) {
        const InspectResult result = PluginRegistry::instance().inspect(file);
        if (!result.plugins.empty()) print_table(result.plugins);
        for (auto& r : result.refusals)
          std::cerr << "hasten: error: " << file << (r.plugin.empty() ? "" : " [" + r.plugin + "]")
                    << " is not a valid hasten plugin: " << r.reason << std::endl;
        if (result.valid) std::cout << file << ": valid hasten plugin library (ABI 1)" << std::endl;
        if (!result.valid) ++invalid;
      }
      return invalid == 0 ? 0 : 1;
    };
  });
}

}  // namespace hasten::cli
