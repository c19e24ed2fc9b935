// Loading one plugin library (plugin_loading.cpp): what the registry calls. Never throws but
// for a bad HASTEN_PLUGIN_PROBE_TIMEOUT_S.
#pragma once

#include <hasten/registry.hpp>

#include <memory>
#include <string>
#include <vector>

#include "plugins/loaded_plugin.hpp"
#include "plugins/probe_cache.hpp"

namespace hasten::detail {

struct LoadOutcome {
  std::vector<std::unique_ptr<LoadedPlugin>> plugins;
  std::vector<PluginRefusal> refusals;
  bool unsafe = false;  // refused by the probe: loading it here would have crashed or hung
};

// Checks, probes (unless `cache` remembers this very file) and loads `file`.
LoadOutcome load_library(const std::string& file, ProbeCache* cache);

// Loading a library runs its code: one that anyone on the machine may replace, or that sits
// in a directory where anyone may replace it (a sticky directory such as /tmp excepted: there
// only its owner can), is refused. "" when file and its directory are safe.
std::string unsafe_permissions(const std::string& file);

std::string canonical_or_same(const std::string& path);
std::vector<std::string> split_path_list(const std::string& s);

}  // namespace hasten::detail
