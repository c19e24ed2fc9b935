// RestRun::replay: an earlier run's journal sent again. A run whose server was away at its end
// (or whose process died) leaves <logging_dir>/<project>/mlflow-journal/<id>.jsonl with every
// record it logged; the next run against the same server from there queues them again. The
// server keeps them once: the run is found by its hasten.run_token tag before it is made,
// params and tags are set to the same values, MLflow's SQL store drops a metric logged again
// with the same key, step, timestamp and value, and artifacts are written over.
#include "rest_run.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file_store.hpp"
#include "rest_client.hpp"

namespace hasten::mlflow {

std::unique_ptr<RestRun> RestRun::replay(Settings settings) {
  const std::filesystem::path path = settings.journal;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st {};
  // Locked: a live run's. No links left: its run sent it all and removed it meanwhile.
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0 || ::fstat(fd, &st) != 0 || st.st_nlink == 0) {
    ::close(fd);
    return nullptr;
  }
  std::unique_ptr<RestRun> run(new RestRun(std::move(settings), ReplayTag{}));
  run->lock_fd_ = fd;  // held until the replay ends
  std::ifstream in(path);
  std::string line;
  size_t unreadable = 0;
  int64_t last_ms = 0;
  bool has_run = false;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) {  // a line cut short by a crash: the ones before it stand
      ++unreadable;
      continue;
    }
    if (j.contains("run")) {
      const auto& r = j["run"];
      if (r.value("tracking_uri", "") != without_credentials(run->settings_.uri)) return nullptr;  // another server's
      run->identity_.experiment = r.value("experiment", "");
      run->identity_.run_name = r.value("run_name", "");
      run->identity_.user = r.value("user", "");
      run->identity_.start_ms = r.value("start_time", int64_t{0});
      run->token_ = r.value("hasten.run_token", "");
      last_ms = run->identity_.start_ms;
      has_run = !run->token_.empty() && !run->identity_.experiment.empty();
    } else if (j.contains("status")) {
      run->final_status_ = j["status"].get<std::string>();
      run->end_ms_ = j.value("end_time", int64_t{0});
    } else {
      for (auto [key, kind] : {std::pair{"param", Record::Param}, {"tag", Record::Tag}, {"metric", Record::Metric},
                               {"artifact", Record::Artifact}}) {
        if (!j.contains(key)) continue;
        if (kind == Record::Artifact && !std::filesystem::exists(j[key].value("file", std::string("/nonexistent")))) {
          ++unreadable;  // its bytes were kept in the earlier process's memory only
          continue;
        }
        run->queue_.push_back({kind, j[key], {}});
        if (kind == Record::Metric) last_ms = std::max(last_ms, j[key].value("timestamp", int64_t{0}));
      }
    }
  }
  if (!has_run) return nullptr;
  if (run->final_status_.empty()) {  // its process died before the end: as MLflow's clients end such a run
    run->final_status_ = "FAILED";
    run->end_ms_ = last_ms;
  }
  if (unreadable > 0)
    run->settings_.warn(std::to_string(unreadable) + " unreadable lines in " + path.string() + " are left out of its replay");
  run->queued_ = run->queue_.size();
  run->create_tried_ = true;  // the earlier process may have made the run: look for its token first
  run->sender_ = std::thread([r = run.get()] { r->run(); });
  return run;
}

}  // namespace hasten::mlflow
