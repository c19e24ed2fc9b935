// Accelerator::get_tracker's answer (Accelerate's get_tracker): one running tracker by its
// name, with what names its run in the tracker's own terms and a log call to it alone.
// Trackers run in a host process of their own, so the handle is not the plugin's object; it is
// what a program needs of it: the MLflow run id to link a run, the TensorBoard log directory
// to point a viewer at, and logging to one tracker.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace hasten {

class TrackerHandle {
 public:
  using LogFn = std::function<void(const std::vector<std::pair<std::string, double>>&, int64_t)>;
  TrackerHandle(std::string name, std::map<std::string, std::string> run_info, LogFn log)
      : name_(std::move(name)), run_info_(std::move(run_info)), log_(std::move(log)) {}

  const std::string& name() const { return name_; }
  // True on a process other than the main one, where trackers do not run (Accelerate's blank
  // tracker): run_info is empty and log does nothing, so one code path serves every rank.
  bool blank() const { return !log_; }
  // As the tracker said at get_tracker (docs/trackers.md lists each tracker's keys), e.g.
  // mlflow's run_id, experiment_id, tracking_uri, artifact_uri; tensorboard's log_dir.
  const std::map<std::string, std::string>& run_info() const { return run_info_; }
  // One key of run_info, "" when the tracker did not name it.
  std::string run_info(const std::string& key) const {
    auto it = run_info_.find(key);
    return it == run_info_.end() ? std::string() : it->second;
  }
  // Scalars to this tracker alone (Accelerate's get_tracker(name).log); after end_training, or
  // once the tracker has stopped on a failure, nothing.
  void log(const std::vector<std::pair<std::string, double>>& values, int64_t step = -1) const {
    if (log_) log_(values, step);
  }

 private:
  std::string name_;
  std::map<std::string, std::string> run_info_;
  LogFn log_;
};

}  // namespace hasten
