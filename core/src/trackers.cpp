// Tracker fan-out: the main process starts one tracker plugin per configured name and every
// log call goes to all of them; end_training flushes and finishes them. A tracker that fails
// once it runs (an unwritable directory, a full disk) is reported in one warning and dropped:
// losing a log must not end the training it records.
#include <hasten/accelerator.hpp>
#include <hasten/error.hpp>
#include <hasten/logging.hpp>
#include <hasten/registry.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <variant>

#include "engine_state.hpp"
#include "text_util.hpp"

namespace fs = std::filesystem;

namespace hasten::detail {

namespace {

// Runs op on every tracker; one that fails is reported once (its message names the plugin,
// its file and the path it could not write) and leaves the run.
template <class Op>
void for_each_tracker(std::vector<std::unique_ptr<TrackerInstance>>& trackers, const char* what, Op&& op) {
  for (auto it = trackers.begin(); it != trackers.end();) {
    try {
      op(**it);
      ++it;
    } catch (const PluginError& e) {
      get_logger()->warn("tracker '{}' stopped at {}, training goes on without it: {}", (*it)->name(), what, e.what());
      it = trackers.erase(it);
    }
  }
}

}  // namespace

void Engine::init_trackers(const std::string& project, const std::string& hparams_json) {
  Impl& s = *impl_;
  if (!s.process.is_main_process()) return;  // trackers live on the main process
  if (!s.trackers.empty()) throw UsageError("init_trackers: trackers are already running");
  // Creating the plugins checks their options: a configuration error, which stops the run.
  std::vector<std::unique_ptr<TrackerInstance>> trackers;
  for (auto& [selection, options] : choose_trackers(s.config))
    trackers.push_back(std::make_unique<TrackerInstance>(selection, &s.host.api, options));
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
                   [&](TrackerInstance& t) { t.start(project, dir.string(), hparams_json, s.process.rank); });
  s.trackers = std::move(trackers);
}

void Engine::log(const std::vector<std::pair<std::string, double>>& values, int64_t step) {
  for_each_tracker(impl_->trackers, "log", [&](TrackerInstance& t) { t.log_scalars(values, step); });
}

void Engine::log_text(const std::string& name, const std::string& text, int64_t step) {
  for_each_tracker(impl_->trackers, "log_text", [&](TrackerInstance& t) { t.log_text(name, text, step); });
}

void Engine::end_training() {
  auto trackers = std::move(impl_->trackers);
  impl_->trackers.clear();
  for_each_tracker(trackers, "end_training", [](TrackerInstance& t) {
    t.flush();
    t.finish(HASTEN_OK);
  });
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
