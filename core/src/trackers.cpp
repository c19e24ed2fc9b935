// Tracker fan-out: the main process starts one tracker plugin per configured name and every
// log call goes to all of them; end_training flushes and finishes them.
#include <hasten/accelerator.hpp>
#include <hasten/error.hpp>
#include <hasten/registry.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <variant>

#include "engine_state.hpp"
#include "text_util.hpp"

namespace fs = std::filesystem;

namespace hasten::detail {

void Engine::init_trackers(const std::string& project, const std::string& hparams_json) {
  Impl& s = *impl_;
  if (!s.process.is_main_process()) return;  // trackers live on the main process
  if (!s.trackers.empty()) throw UsageError("init_trackers: trackers are already running");
  const fs::path dir = fs::path(s.config.effective_logging_dir()) / project;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw Error("init_trackers: cannot create logging directory '" + dir.string() + "': " + ec.message());
  const auto options = nlohmann::json::parse(s.config.tracker_options);
  // tracker_options are keyed by the tracker as `trackers` names it, or by the plugin's own
  // name (a tracker selected by path); a key that is neither is a typo, not an option set to
  // drop without a word.
  std::vector<PluginSelection> selected;
  std::vector<std::string> keys;
  for (const auto& name : s.config.trackers) {
    selected.push_back(PluginRegistry::instance().select(PluginKind::Tracker, name));
    keys.push_back(name);
    keys.push_back(selected.back().info->name);
  }
  for (auto it = options.begin(); it != options.end(); ++it) {
    if (std::find(keys.begin(), keys.end(), it.key()) != keys.end()) continue;
    std::string msg = "tracker_options: '" + it.key() + "' is not a configured tracker (trackers: " +
                      (s.config.trackers.empty() ? std::string("none") : join(s.config.trackers, ", ")) + ")";
    const std::string near = nearest(it.key(), keys);
    if (!near.empty()) msg += "; did you mean '" + near + "'?";
    throw ConfigError("config error: " + msg);
  }
  for (size_t i = 0; i < selected.size(); ++i) {
    const std::string& name = s.config.trackers[i];
    const std::string& plugin = selected[i].info->name;
    if (options.contains(name) && name != plugin && options.contains(plugin))
      throw ConfigError("config error: tracker_options has options for '" + name + "' and for its plugin name '" + plugin +
                        "'; keep one");
    const std::string opts = options.contains(name) ? options[name].dump() : options.contains(plugin) ? options[plugin].dump() : "{}";
    auto tracker = std::make_unique<TrackerInstance>(selected[i], &s.host.api, opts);
    tracker->start(project, dir.string(), hparams_json, s.process.rank);
    s.trackers.push_back(std::move(tracker));
  }
}

void Engine::log(const std::vector<std::pair<std::string, double>>& values, int64_t step) {
  for (auto& t : impl_->trackers) t->log_scalars(values, step);
}

void Engine::log_text(const std::string& name, const std::string& text, int64_t step) {
  for (auto& t : impl_->trackers) t->log_text(name, text, step);
}

void Engine::end_training() {
  auto trackers = std::move(impl_->trackers);
  impl_->trackers.clear();
  for (auto& t : trackers) {
    t->flush();
    t->finish(HASTEN_OK);
  }
}

}  // namespace hasten::detail

namespace hasten {

void Accelerator::init_trackers(const std::string& project, const Hparams& hparams) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (auto& [key, value] : hparams)
    std::visit([&, k = key](const auto& v) { j[k] = v; }, value);
  engine_->init_trackers(project, j.dump());
}

}  // namespace hasten
