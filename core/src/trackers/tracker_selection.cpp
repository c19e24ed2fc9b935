// Which tracker plugins a run starts and with which options: shared by init_trackers and the
// launcher's check before any worker starts (preflight.cpp).
#include <hasten/config.hpp>
#include <hasten/error.hpp>
#include <hasten/registry.hpp>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <algorithm>

#include "config/config_schema.hpp"
#include "util/text_util.hpp"
#include "trackers/tracker_instance.hpp"

namespace hasten::detail {

namespace {

// `all` (Accelerate's log_with="all") stands for every tracker plugin found, by name.
std::vector<std::string> tracker_names(const std::vector<std::string>& configured) {
  if (std::find(configured.begin(), configured.end(), "all") == configured.end()) return configured;
  if (configured.size() != 1)
    throw ConfigError("config error: trackers [" + join(configured, ", ") +
                      "]: 'all' already names every installed tracker; give it alone or list the trackers");
  std::vector<std::string> names;
  for (const auto& info : PluginRegistry::instance().plugins())
    if (info.kind == PluginKind::Tracker) names.push_back(info.name);
  return names;
}

}  // namespace

std::vector<std::pair<PluginSelection, std::string>> choose_trackers(const Config& config,
                                                                     const std::map<std::string, std::string>& init_kwargs) {
  const auto options = nlohmann::json::parse(config.tracker_options);
  const std::vector<std::string> trackers = tracker_names(config.trackers);
  // tracker_options are keyed by the tracker as `trackers` names it, or by the plugin's own
  // name (a tracker selected by path); a key that is neither is a typo, not an option set to
  // drop without a word.
  std::vector<PluginSelection> selected;
  std::vector<std::string> keys;
  for (const auto& name : trackers) {
    selected.push_back(PluginRegistry::instance().select(PluginKind::Tracker, name));
    keys.push_back(name);
    keys.push_back(selected.back().info->name);
  }
  for (auto it = options.begin(); it != options.end(); ++it) {
    if (std::find(keys.begin(), keys.end(), it.key()) != keys.end()) continue;
    std::string msg = "tracker_options: '" + it.key() + "' is not a configured tracker (trackers: " +
                      (trackers.empty() ? std::string("none") : join(trackers, ", ")) + ")";
    const std::string near = nearest(it.key(), keys);
    if (!near.empty()) msg += "; did you mean '" + near + "'?";
    throw ConfigError("config error: " + msg);
  }
  // init_trackers's init_kwargs: a mapping per configured tracker.
  nlohmann::json kwargs = nlohmann::json::object();
  for (const auto& [key, text] : init_kwargs) {
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      std::string msg = "init_trackers: init_kwargs names '" + key + "', which is not a configured tracker (trackers: " +
                        (trackers.empty() ? std::string("none") : join(trackers, ", ")) + ")";
      const std::string near = nearest(key, keys);
      if (!near.empty()) msg += "; did you mean '" + near + "'?";
      throw UsageError(msg);
    }
    nlohmann::json value;
    try {
      value = yaml_to_json(YAML::Load(text), "init_kwargs['" + key + "']");
    } catch (const YAML::Exception& e) {
      throw UsageError("init_trackers: init_kwargs['" + key + "'] is not YAML or JSON: " + e.msg);
    }
    if (!value.is_object())
      throw UsageError("init_trackers: init_kwargs['" + key + "'] is " + text + " (allowed: a mapping of the tracker's options, e.g. {run_name: x})");
    kwargs[key] = std::move(value);
  }
  std::vector<std::pair<PluginSelection, std::string>> out;
  for (size_t i = 0; i < selected.size(); ++i) {
    const std::string& name = trackers[i];
    const std::string& plugin = selected[i].info->name;
    if (options.contains(name) && name != plugin && options.contains(plugin))
      throw ConfigError("config error: tracker_options has options for '" + name + "' and for its plugin name '" +
                        plugin + "'; keep one");
    if (name != plugin && kwargs.contains(name) && kwargs.contains(plugin))
      throw UsageError("init_trackers: init_kwargs has options for '" + name + "' and for its plugin name '" + plugin +
                       "'; keep one");
    nlohmann::json mine = options.contains(name) ? options[name] : options.contains(plugin) ? options[plugin] : nlohmann::json::object();
    for (const auto& key : {name, plugin}) {
      if (!kwargs.contains(key)) continue;
      if (!mine.is_object()) mine = nlohmann::json::object();
      for (auto it = kwargs[key].begin(); it != kwargs[key].end(); ++it) mine[it.key()] = it.value();
    }
    out.emplace_back(selected[i], mine.dump());
  }
  return out;
}

}  // namespace hasten::detail
