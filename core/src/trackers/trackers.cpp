// Tracker fan-out: the main process starts one tracker plugin per configured name and every
// log call goes to all of them; end_training flushes and finishes them. Each tracker runs in a
// host process of its own unless trackers_in_process is set (running_tracker.cpp). A tracker
// that fails once it runs (an unwritable directory, a full disk, a crash of its host process)
// is reported in one warning and dropped: losing a log must not end the training it records,
// and the other trackers keep every value.
#include <hasten/detail/engine.hpp>
#include <hasten/error.hpp>
#include <hasten/logging.hpp>
#include <hasten/registry.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <variant>

#include "engine/engine_state.hpp"
#include "util/text_util.hpp"
#include "trackers/tracker_instance.hpp"

namespace fs = std::filesystem;

namespace hasten::detail {

void Engine::init_trackers(const std::string& project, const std::string& hparams_json, const TrackerKwargs& init_kwargs) {
  Impl& s = *impl_;
  if (!s.process.is_main_process()) return;  // trackers live on the main process
  if (!s.trackers.empty()) throw UsageError("init_trackers: trackers are already running");
  // Creating the plugins checks their options: a configuration error, which stops the run.
  // A host process that dies while creating its tracker is a crash, reported like the others.
  std::vector<std::unique_ptr<RunningTracker>> trackers;
  for (auto& [selection, options] : choose_trackers(s.config, init_kwargs)) {
    if (s.config.trackers_in_process) {
      trackers.push_back(make_in_process_tracker(selection, &s.host.api, options));
      continue;
    }
    try {
      trackers.push_back(make_isolated_tracker(selection, options, s.process, s.config.log_level));
    } catch (const TrackerDied& e) {
      get_logger()->warn("tracker '{}' stopped at create, training goes on without it: {}", selection.info->name,
                         e.what());
    }
  }
  for (auto it = trackers.begin(); it != trackers.end();) {
    try {
      (*it)->wait_created();
      ++it;
    } catch (const TrackerDied& e) {
      get_logger()->warn("tracker '{}' stopped at create, training goes on without it: {}", (*it)->name(), e.what());
      it = trackers.erase(it);
    }
  }
  if (trackers.empty()) return;
  const fs::path dir = fs::path(s.config.effective_logging_dir()) / project;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    std::vector<std::string> names;
    for (auto& t : trackers) names.push_back("'" + t->name() + "'");
    const bool one = names.size() == 1;
    get_logger()->warn("{} {} not started, training goes on without {}: cannot create logging directory '{}': {}",
                       one ? "tracker" : "trackers", join(names, ", "), one ? "it" : "them", dir.string(),
                       ec.message());
    return;
  }
  for_each_tracker(trackers, "start",
                   [&](RunningTracker& t) { t.start(project, dir.string(), hparams_json, s.process.rank); });
  s.trackers = std::move(trackers);
}

void Engine::log(const std::vector<std::pair<std::string, double>>& values, int64_t step) {
  for_each_tracker(impl_->trackers, "log", [&](RunningTracker& t) { t.log_scalars(values, step); });
}

TrackerHandle Engine::get_tracker(const std::string& name, std::weak_ptr<Engine> self) {
  Impl& s = *impl_;
  if (!s.process.is_main_process()) return TrackerHandle(name, {}, nullptr);  // Accelerate's blank tracker
  auto it = std::find_if(s.trackers.begin(), s.trackers.end(), [&](auto& t) { return t->name() == name; });
  if (it == s.trackers.end()) {
    std::vector<std::string> names;
    for (auto& t : s.trackers) names.push_back(t->name());
    throw UsageError("get_tracker: no running tracker '" + name + "' (running: " +
                     (names.empty() ? std::string("none; init_trackers starts the configured ones") : join(names, ", ")) +
                     ")");
  }
  std::map<std::string, std::string> info;
  try {
    const auto j = nlohmann::json::parse((*it)->run_info(), nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) throw PluginError("its run_info is not the text of a JSON object");
    for (auto kv = j.begin(); kv != j.end(); ++kv) info[kv.key()] = kv->is_string() ? kv->get<std::string>() : kv->dump();
  } catch (const PluginError& e) {
    // The tracker keeps logging; only what names its run is missing.
    get_logger()->warn("get_tracker: tracker '{}' did not say what names its run: {}", name, e.what());
  }
  return TrackerHandle(name, std::move(info), [self = std::move(self), name](const Metrics& values, int64_t step) {
    auto engine = self.lock();
    if (engine == nullptr) return;
    for_each_tracker(engine->impl_->trackers, "log", [&](RunningTracker& t) {
      if (t.name() == name) t.log_scalars(values, step);
    });
  });
}

void Engine::end_training() {
  auto trackers = std::move(impl_->trackers);
  impl_->trackers.clear();
  // Each tracker flushes and finishes; an isolated one's host process is waited for (a
  // bounded wait), so that its files are complete when end_training returns.
  for_each_tracker(trackers, "end_training", [](RunningTracker& t) { t.end(HASTEN_OK); });
}

}  // namespace hasten::detail

namespace hasten {

void detail::Engine::init_trackers(const std::string& project, const Hparams& hparams, const TrackerKwargs& init_kwargs) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (auto& [key, value] : hparams)
    std::visit([&, k = key](const auto& v) { j[k] = v; }, value);
  init_trackers(project, j.dump(), init_kwargs);
}

}  // namespace hasten
