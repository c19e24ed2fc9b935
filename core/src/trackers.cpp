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
  for (auto& [selection, options] : choose_trackers(s.config)) {
    auto tracker = std::make_unique<TrackerInstance>(selection, &s.host.api, options);
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
