// The plugin registry: discovery (the search path), what loaded and what was refused, selection
// by name, preset or path (plugin_loading.cpp loads and validates one library).
#define BOOST_DLL_USE_STD_FS 1
#include <hasten/error.hpp>
#include <hasten/logging.hpp>
#include <hasten/registry.hpp>

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "plugins/plugin_loading.hpp"
#include "plugins/abi_array.hpp"
#include "plugins/elf_check.hpp"
#include "plugins/host_api.hpp"
#include "plugins/loaded_plugin.hpp"
#include "plugins/plugin_description.hpp"
#include "plugins/plugin_probe.hpp"
#include "plugins/probe_cache.hpp"
#include "util/text_util.hpp"

namespace fs = std::filesystem;

namespace hasten {

const char* to_string(PluginKind kind) noexcept {
  switch (kind) {
    case PluginKind::Strategy: return "strategy";
    case PluginKind::Precision: return "precision";
    case PluginKind::Tracker: return "tracker";
    case PluginKind::Comm: return "comm";
  }
  return "unknown";
}

PluginKind plugin_kind_from_string(const std::string& name) {
  if (name == "strategy") return PluginKind::Strategy;
  if (name == "precision") return PluginKind::Precision;
  if (name == "tracker") return PluginKind::Tracker;
  if (name == "comm") return PluginKind::Comm;
  throw ConfigError("unknown plugin kind '" + name +
                    "' (allowed: strategy, precision, tracker, comm)");
}

using detail::canonical_or_same;
using detail::load_library;
using detail::LoadedPlugin;
using detail::LoadOutcome;
using detail::split_path_list;
using detail::unsafe_permissions;


struct PluginRegistry::Impl {
  std::mutex mutex;
  std::vector<std::string> extra_dirs;
  std::set<std::string> scanned_dirs;
  std::set<std::string> loaded_files;
  std::deque<std::unique_ptr<LoadedPlugin>> plugins;       // discovered, unique names
  std::deque<std::unique_ptr<LoadedPlugin>> path_plugins;  // selected by path
  std::map<std::string, std::vector<PluginRefusal>> path_refusals;
  std::vector<PluginRefusal> refusals;
  std::vector<PluginRefusal> unreported;  // files the probe refused, not yet warned about
  std::unique_ptr<detail::ProbeCache> cache;

  detail::ProbeCache* cache_locked() {
    if (!cache) cache = std::make_unique<detail::ProbeCache>();
    return cache.get();
  }

  std::vector<std::string> search_path_locked() const {
    std::vector<std::string> dirs;
    try {
      // The plugin folder next to the library holding this code: build/lib/hasten/plugins in
      // the build tree, <prefix>/lib/hasten/plugins when installed.
      dirs.push_back((boost::dll::this_line_location().parent_path() / "hasten" / "plugins")
                         .lexically_normal()
                         .string());
    } catch (const std::exception&) {
    }
    // Relative entries would make what loads depend on the working directory.
    if (const char* env = std::getenv("HASTEN_PLUGIN_PATH"))
      for (auto& d : split_path_list(env)) {
        if (!d.empty() && d[0] != '/')
          throw ConfigError("HASTEN_PLUGIN_PATH: '" + d +
                            "' is a relative directory, which would load plugins from wherever the program runs "
                            "(allowed: absolute directories, separated by ':')");
        dirs.push_back(d);
      }
    for (auto& d : extra_dirs) dirs.push_back(d);
    return dirs;
  }

  void register_outcome(LoadOutcome outcome) {
    for (auto& r : outcome.refusals) refusals.push_back(r);
    if (outcome.unsafe)
      for (auto& r : outcome.refusals) unreported.push_back(r);
    for (auto& p : outcome.plugins) {
      const LoadedPlugin* clash = find_locked(p->info.kind, p->info.name, true);
      if (clash != nullptr) {
        refusals.push_back({p->info.file, std::string(to_string(p->info.kind)) + "/" + p->info.name,
                            "duplicate " + std::string(to_string(p->info.kind)) + " name '" +
                                p->info.name + "': already provided by " + clash->info.file});
        continue;
      }
      if (const std::string why = claim_clash(*p); !why.empty()) {
        refusals.push_back({p->info.file, std::string(to_string(p->info.kind)) + "/" + p->info.name, why});
        continue;
      }
      plugins.push_back(std::move(p));
    }
  }

  // A strategy may not claim a config section or a distributed_type another one holds.
  std::string claim_clash(const LoadedPlugin& p) const {
    for (auto& q : plugins) {
      if (q->info.kind != PluginKind::Strategy || p.info.kind != PluginKind::Strategy) continue;
      if (!p.info.config_section.empty() && p.info.config_section == q->info.config_section)
        return "config_section '" + p.info.config_section + "' is already owned by strategy '" + q->info.name +
               "' (" + q->info.file + ")";
      for (auto& t : p.info.distributed_types)
        for (auto& u : q->info.distributed_types)
          if (t == u)
            return "distributed_type '" + t + "' is already claimed by strategy '" + q->info.name + "' (" +
                   q->info.file + ")";
    }
    return "";
  }

  // A plugin whose name (or, with presets, preset name) is `name`.
  const LoadedPlugin* find_locked(PluginKind kind, const std::string& name, bool presets) const {
    for (auto& p : plugins) {
      if (p->info.kind != kind) continue;
      if (p->info.name == name) return p.get();
      if (presets)
        for (auto& pr : p->info.presets)
          if (pr.name == name) return p.get();
    }
    return nullptr;
  }

  void discover_locked() {
    detail::probe_timeout_s();  // a bad HASTEN_PLUGIN_PROBE_TIMEOUT_S is an error before any file
    for (const auto& dir : search_path_locked()) {
      const std::string key = canonical_or_same(dir);
      if (!scanned_dirs.insert(key).second) continue;
      std::error_code ec;
      if (!fs::is_directory(dir, ec)) continue;
      std::vector<std::string> files;
      for (auto& entry : fs::directory_iterator(dir, ec)) {
        const std::string name = entry.path().filename().string();
        if (name.rfind("libhasten-", 0) == 0 && name.size() > 3 &&
            name.compare(name.size() - 3, 3, ".so") == 0)
          files.push_back(entry.path().string());
      }
      std::sort(files.begin(), files.end());
      for (auto& f : files) {
        const std::string canon = canonical_or_same(f);
        if (!loaded_files.insert(canon).second) continue;
        // The name as found, too: a link in a world-writable directory to a library elsewhere
        // is as replaceable as a file there.
        if (const std::string why = unsafe_permissions(f); !why.empty()) {
          refusals.push_back({f, "", why});
          continue;
        }
        register_outcome(load_library(canon, cache_locked()));
      }
    }
    if (cache) cache->save();
  }
};

PluginRegistry::PluginRegistry() : impl_(std::make_unique<Impl>()) {}

PluginRegistry& PluginRegistry::instance() {
  static PluginRegistry* registry = new PluginRegistry();  // never destroyed (see keeper)
  return *registry;
}

void PluginRegistry::add_search_directories(const std::vector<std::string>& dirs) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  for (auto& d : dirs)
    if (std::find(impl_->extra_dirs.begin(), impl_->extra_dirs.end(), d) == impl_->extra_dirs.end())
      impl_->extra_dirs.push_back(d);
}

std::vector<std::string> PluginRegistry::search_path() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->search_path_locked();
}

void PluginRegistry::discover() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->discover_locked();
}

std::vector<PluginInfo> PluginRegistry::plugins() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->discover_locked();
  std::vector<PluginInfo> out;
  for (auto& p : impl_->plugins) out.push_back(p->info);
  std::sort(out.begin(), out.end(), [](const PluginInfo& a, const PluginInfo& b) {
    return std::make_pair(static_cast<int>(a.kind), a.name) <
           std::make_pair(static_cast<int>(b.kind), b.name);
  });
  return out;
}

std::vector<PluginRefusal> PluginRegistry::refusals() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->discover_locked();
  return impl_->refusals;
}

PluginSelection PluginRegistry::select(PluginKind kind, const std::string& name_or_path) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const std::string kind_name = to_string(kind);
  const bool is_path = name_or_path.find('/') != std::string::npos ||
                       (name_or_path.size() > 3 &&
                        name_or_path.compare(name_or_path.size() - 3, 3, ".so") == 0);
  if (is_path) {
    const std::string file = canonical_or_same(name_or_path);
    std::vector<const LoadedPlugin*> matches;
    auto collect = [&] {
      matches.clear();
      for (auto& p : impl_->path_plugins)
        if (p->info.file == file && p->info.kind == kind) matches.push_back(p.get());
    };
    collect();
    if (matches.empty() && impl_->path_refusals.count(file) == 0) {
      // The path as given, too (a link's own directory), then the file it names.
      const std::string why = unsafe_permissions(name_or_path);
      LoadOutcome outcome = why.empty() ? load_library(file, impl_->cache_locked())
                                        : LoadOutcome{{}, {{file, "", why}}, false};
      impl_->cache->save();
      impl_->path_refusals[file] = outcome.refusals;
      for (auto& p : outcome.plugins) impl_->path_plugins.push_back(std::move(p));
      collect();
    }
    if (matches.empty()) {
      const auto& refused = impl_->path_refusals[file];
      std::string why = refused.empty() ? "it declares no " + kind_name + " plugin"
                                        : refused.front().reason;
      throw PluginError(kind_name + " plugin file '" + name_or_path + "' was refused: " + why);
    }
    if (matches.size() > 1) {
      std::vector<std::string> names;
      for (auto* m : matches) names.push_back(m->info.name);
      throw PluginError(kind_name + " plugin file '" + name_or_path + "' declares several " +
                        kind_name + " plugins (" + detail::join(names, ", ") +
                        "); select one by name and add its directory to plugin_path");
    }
    return {matches[0], &matches[0]->info, "", "{}"};
  }

  impl_->discover_locked();
  if (const LoadedPlugin* p = impl_->find_locked(kind, name_or_path, false))
    return {p, &p->info, "", "{}"};
  if (const LoadedPlugin* p = impl_->find_locked(kind, name_or_path, true))
    for (auto& pr : p->info.presets)
      if (pr.name == name_or_path) return {p, &p->info, pr.name, pr.options_json};

  std::vector<std::string> names;
  for (auto& p : impl_->plugins) {
    if (p->info.kind != kind) continue;
    names.push_back(p->info.name);
    for (auto& pr : p->info.presets) names.push_back(pr.name);
  }
  std::sort(names.begin(), names.end());
  std::string message = "unknown " + kind_name + " plugin '" + name_or_path + "'";
  // A library named after it that was refused says more than "unknown".
  for (auto& r : impl_->refusals) {
    const std::string stem = "libhasten-" + kind_name + "-" + name_or_path + ".so";
    if (fs::path(r.file).filename() == stem || r.plugin == kind_name + "/" + name_or_path) {
      message += ": " + r.file + " was refused: " + r.reason;
      throw PluginError(message);
    }
  }
  message += " (available: " + (names.empty() ? std::string("none") : detail::join(names, ", ")) + ")";
  const std::string near = detail::nearest(name_or_path, names);
  if (!near.empty()) message += "; did you mean '" + near + "'?";
  throw PluginError(message);
}

std::string PluginRegistry::nearest_name(const std::string& name) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->discover_locked();
  std::vector<std::string> names;
  for (auto& p : impl_->plugins) {
    names.push_back(p->info.name);
    for (auto& pr : p->info.presets) names.push_back(pr.name);
  }
  return detail::nearest(name, names);
}

void PluginRegistry::report_skipped_files() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  for (auto& r : impl_->unreported) get_logger()->warn("plugin file {} skipped: {}", r.file, r.reason);
  impl_->unreported.clear();
}

InspectResult PluginRegistry::inspect(const std::string& path) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  InspectResult result;
  // Always probed afresh: inspect is how one finds out what is wrong with a file now. The path
  // as given is judged too (a link's own directory), as discovery and selection do.
  const std::string why = unsafe_permissions(path);
  LoadOutcome outcome = why.empty() ? load_library(canonical_or_same(path), nullptr)
                                    : LoadOutcome{{}, {{canonical_or_same(path), "", why}}, false};
  for (auto& p : outcome.plugins) result.plugins.push_back(p->info);
  result.refusals = std::move(outcome.refusals);
  result.valid = !result.plugins.empty() && result.refusals.empty();
  return result;
}

}  // namespace hasten
