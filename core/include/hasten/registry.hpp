// The plugin registry: finds plugin libraries, loads them once (Boost.DLL), validates what
// they declare against ABI v1 and selects plugins by kind and name, preset or path.
//
// Search order: the plugin directory next to libhasten (build/lib/hasten/plugins in the
// build tree, <prefix>/lib/hasten/plugins when installed), then each directory of
// HASTEN_PLUGIN_PATH (':'-separated), then the config's plugin_path. Only files named
// libhasten-*.so are considered. Libraries stay loaded until the process ends.
//
// Before a file is loaded in this process its ELF headers are checked and a child process
// loads it, runs its entry function and reads its descriptors within a time limit
// (HASTEN_PLUGIN_PROBE_TIMEOUT_S, default 10 s); a file that crashes, aborts or hangs there is
// refused (plugin_probe.cpp). Verdicts are remembered by path, size and mtime
// (probe_cache.hpp), so later starts do not probe again.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

struct hasten_plugin_descriptor;

namespace hasten {

enum class PluginKind { Strategy = 1, Precision = 2, Tracker = 3, Comm = 4 };

const char* to_string(PluginKind kind) noexcept;
// "strategy" -> Strategy...; throws ConfigError on an unknown name.
PluginKind plugin_kind_from_string(const std::string& name);

struct PluginPreset {
  std::string name;
  std::string description;
  std::string options_json;
};

// One option a plugin describes (ABI 1.2 hasten_option_spec).
struct PluginOption {
  std::string name;  // "" for a config-section key that sets no option
  std::string type;  // bool, int, float, string, enum, list, any
  std::vector<std::string> allowed;  // enum values
  std::string default_json;          // "" when none
  std::string help;
  std::optional<double> min;
  std::optional<double> max;
  std::string section_key;  // strategies: the key in the plugin's config section, "" when none
  std::string run_setting;  // strategies: the top-level key the section key also sets
};

// One plugin a library declared and the registry accepted.
struct PluginInfo {
  PluginKind kind;
  std::string name;
  std::string version;
  std::string description;
  unsigned abi_major = 0;
  unsigned abi_minor = 0;
  std::string tier;  // "c" or "torch"
  std::string torch_fingerprint;
  std::string file;
  std::vector<PluginPreset> presets;
  // Comm plugins (ABI 1.1 hasten_comm_serves): the DLPack device types served, whether ranks
  // may span machines, and the priority under `comm: auto`. serves_declared is false for a
  // backend that declares nothing (selectable by name only).
  bool serves_declared = false;
  std::vector<int> serves_device_types;
  bool serves_any_machines = false;
  int serves_priority = 0;
  // ABI 1.2: the options the plugin describes (options_described false: it checks them
  // itself), and for strategies the config section it owns and the distributed_type values
  // that select it.
  bool options_described = false;
  std::vector<PluginOption> options;
  std::string config_section;
  std::vector<std::string> distributed_types;
};

// A library or descriptor the registry refused, and why (one line).
struct PluginRefusal {
  std::string file;
  std::string plugin;  // "kind/name" when the refusal concerns one descriptor, else ""
  std::string reason;
};

// The result of loading one file on its own (`hasten plugins inspect`).
struct InspectResult {
  bool valid = false;
  std::vector<PluginInfo> plugins;
  std::vector<PluginRefusal> refusals;
};

namespace detail {
struct LoadedPlugin;
}

// A selected plugin: what to create, with which preset options.
struct PluginSelection {
  const detail::LoadedPlugin* plugin = nullptr;
  const PluginInfo* info = nullptr;
  std::string preset;               // "" when selected by plugin name
  std::string preset_options_json;  // "{}" without a preset
};

class PluginRegistry {
 public:
  // The process-wide registry (plugin libraries are process-wide too).
  static PluginRegistry& instance();

  // Adds directories searched after the built-in ones (config plugin_path). Takes effect
  // at the next discover().
  void add_search_directories(const std::vector<std::string>& dirs);
  std::vector<std::string> search_path() const;

  // Loads every plugin library on the search path once; later calls only pick up newly
  // added directories.
  void discover();

  std::vector<PluginInfo> plugins();
  std::vector<PluginRefusal> refusals();

  // Selects by plugin name or preset name (searching the discovered plugins), or by a
  // path to a library (contains '/' or ends in ".so"; loaded if needed). Throws PluginError
  // naming what is available, or why the file was refused.
  PluginSelection select(PluginKind kind, const std::string& name_or_path);

  // The discovered plugin or preset name of any kind closest to `name` (a plausible typo),
  // or "".
  std::string nearest_name(const std::string& name);

  // Warns once, one line each, about discovered files the probe refused (they would have
  // crashed or hung this process) and that no selection has named. The engine calls it once its
  // plugins are selected, so a file that a selection names is one error, not a warning too.
  void report_skipped_files();

  // Loads one file on its own, without registering it, and reports what it holds.
  InspectResult inspect(const std::string& path);

 private:
  PluginRegistry();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct Config;

// Checks what a run's config asks of plugins without creating any: the strategy, precision,
// comm (several processes) and tracker plugins it names exist and accept their options. The
// launcher calls it before starting workers; it throws the PluginError or ConfigError the
// workers would.
void check_config_plugins(const Config& config);

}  // namespace hasten
