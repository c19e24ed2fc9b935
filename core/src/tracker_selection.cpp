// Which tracker plugins a run starts and with which options: shared by init_trackers and the
// launcher's check before any worker starts (preflight.cpp).
#include <hasten/config.hpp>
#include <hasten/error.hpp>
#include <hasten/registry.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>

#include "text_util.hpp"
#include "tracker_instance.hpp"

namespace hasten::detail {

std::vector<std::pair<PluginSelection, std::string>> choose_trackers(const Config& config) {
  const auto options = nlohmann::json::parse(config.tracker_options);
  // tracker_options are keyed by the tracker as `trackers` names it, or by the plugin's own
  // name (a tracker selected by path); a key that is neither is a typo, not an option set to
  // drop without a word.
  std::vector<PluginSelection> selected;
  std::vector<std::string> keys;
  for (const auto& name : config.trackers) {
    selected.push_back(PluginRegistry::instance().select(PluginKind::Tracker, name));
    keys.push_back(name);
    keys.push_back(selected.back().info->name);
  }
  for (auto it = options.begin(); it != options.end(); ++it) {
    if (std::find(keys.begin(), keys.end(), it.key()) != keys.end()) continue;
    std::string msg = "tracker_options: '" + it.key() + "' is not a configured tracker (trackers: " +
                      (config.trackers.empty() ? std::string("none") : join(config.trackers, ", ")) + ")";
    const std::string near = nearest(it.key(), keys);
    if (!near.empty()) msg += "; did you mean '" + near + "'?";
    throw ConfigError("config error: " + msg);
  }
  std::vector<std::pair<PluginSelection, std::string>> out;
  for (size_t i = 0; i < selected.size(); ++i) {
    const std::string& name = config.trackers[i];
    const std::string& plugin = selected[i].info->name;
    if (options.contains(name) && name != plugin && options.contains(plugin))
      throw ConfigError("config error: tracker_options has options for '" + name + "' and for its plugin name '" +
                        plugin + "'; keep one");
    out.emplace_back(selected[i], options.contains(name)     ? options[name].dump()
                                  : options.contains(plugin) ? options[plugin].dump()
                                                             : "{}");
  }
  return out;
}

}  // namespace hasten::detail
