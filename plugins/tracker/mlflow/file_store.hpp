// Writing MLflow's local file store (the `mlruns/` layout of mlflow/store/tracking/
// file_store.py) so that `mlflow ui --backend-store-uri <root>` lists the runs:
//   <root>/0/meta.yaml                      the Default experiment, made with a new root
//   <root>/.trash/
//   <root>/<experiment_id>/meta.yaml        experiment_id, name, artifact_location, ...
//   <root>/<experiment_id>/<run_id>/meta.yaml   run_uuid, status (int enum), start/end_time, ...
//   <root>/<experiment_id>/<run_id>/{metrics,params,tags,artifacts}/
// Metric files hold lines "<timestamp ms> <value> <step>"; params and tags hold the value.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace hasten::mlflow {

// MLflow's RunStatus numbers as meta.yaml stores them.
enum class RunStatus { Running = 1, Finished = 3, Failed = 4 };

int64_t now_ms();

// A key as MLflow accepts it (letters, digits, '_', '-', '.', ' ', '/', no empty or ".."
// path segment): other characters become '_'.
std::string sanitize_key(const std::string& key);

// A double as Python's float() reads it back: nan, inf, -inf, or the shortest round-trip form.
std::string format_value(double v);

// A run id as MLflow makes them: 32 lowercase hex digits (uuid4().hex).
std::string new_run_id();

class FileStore {
 public:
  // Opens (creating when absent) the store at root. Throws hasten::sdk::Error naming the path.
  explicit FileStore(const std::filesystem::path& root);

  // The id of the active experiment called name, created when there is none.
  std::string experiment(const std::string& name);

  // A new run in experiment_id, RUNNING from now; returns its directory.
  std::filesystem::path create_run(const std::string& experiment_id, const std::string& run_id,
                                   const std::string& run_name, const std::string& user, int64_t start_ms);
  // Rewrites the run's meta.yaml with its final status and end time.
  void end_run(const std::filesystem::path& run_dir, RunStatus status, int64_t end_ms);

  // Whole-value files (params/<key>, tags/<key>): written once, without a trailing newline.
  static void write_value(const std::filesystem::path& file, const std::string& value);
  // An artifact's file (artifacts/<path>), its directories made; replaced when it exists.
  static void write_artifact(const std::filesystem::path& file, const std::string& bytes);
  // Appends one "timestamp value step" line to metrics/<key>.
  static void append_metric(const std::filesystem::path& file, int64_t timestamp_ms, double value, int64_t step);

 private:
  void write_run_meta(const std::filesystem::path& run_dir, RunStatus status, int64_t end_ms);

  std::filesystem::path root_;
  // The run's meta.yaml fields that stay fixed; end_run rewrites the file from them.
  std::string experiment_id_, run_id_, run_name_, user_;
  int64_t start_ms_ = 0;
};

}  // namespace hasten::mlflow
