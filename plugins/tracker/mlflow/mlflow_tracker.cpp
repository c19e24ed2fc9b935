// Tracker "mlflow": one MLflow run per init_trackers call in MLflow's local file store
// (file_store.hpp), in the experiment named after the project: hyperparameters as params,
// scalars as metrics, mlflow.runName/user/source tags, and at the end the run's status and
// end_time: FINISHED after end_training, FAILED when the run ended without it (the engine
// destroys its trackers without finish() only when training did not reach end_training).
// C tier: no LibTorch.
#include <hasten/plugin.hpp>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <pwd.h>
#include <string>
#include <unistd.h>

#include "file_store.hpp"

namespace {

// uri without the user:password@ (or token@) of its authority: what is printed of it.
std::string without_credentials(const std::string& uri) {
  const size_t scheme = uri.find("://");
  if (scheme == std::string::npos) return uri;
  const size_t start = scheme + 3, end = uri.find_first_of("/?#", start);
  const size_t at = uri.rfind('@', end == std::string::npos ? std::string::npos : end);
  if (at == std::string::npos || at < start) return uri;
  return uri.substr(0, start) + "***@" + uri.substr(at + 1);
}

namespace fs = std::filesystem;
namespace mf = hasten::mlflow;
using hasten::sdk::Error;

std::string user_name() {
  if (const char* u = std::getenv("USER"); u && *u) return u;
  if (const passwd* pw = ::getpwuid(::getuid())) return pw->pw_name;
  return "unknown";
}

// The training program: this process, or the one a tracker host process serves (which
// names it in HASTEN_TRAINING_PROGRAM; see docs/plugin-abi.md).
std::string program_path() {
  if (const char* p = std::getenv("HASTEN_TRAINING_PROGRAM"); p && *p) return p;
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.string();
}

// A hyperparameter as MLflow's log_param stores it: str(value) in Python.
std::string param_text(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_null()) return "None";
  if (v.is_number_float()) return mf::format_value(v.get<double>());
  return v.dump();
}

class MlflowTracker final : public hasten::sdk::Tracker {
 public:
  MlflowTracker(const hasten_host_api* host, std::string_view options) : Tracker(host) {
    const hasten::sdk::Options in(host, options);  // keys and types checked against kOptions
    tracking_dir_ = in.text("tracking_dir").value_or("");
    experiment_name_ = in.text("experiment_name").value_or("");
    run_name_ = in.text("run_name").value_or("");
  }

  ~MlflowTracker() override {
    if (store_ == nullptr || ended_) return;
    try {
      store_->end_run(run_dir_, mf::RunStatus::Failed, mf::now_ms());
    } catch (...) {
      // destroy() never fails; a write error here has nowhere to go.
    }
  }

  void start(const hasten_tracker_run& run) override {
    // Where: the tracking_dir option, else MLFLOW_TRACKING_URI when it names a local store
    // (a path or file: URI, as Accelerate's MLflowTracker honours it), else <logging_dir>/mlruns.
    fs::path root = tracking_dir_;
    if (root.empty()) {
      if (const char* uri = std::getenv("MLFLOW_TRACKING_URI"); uri && *uri) {
        std::string u = uri;
        if (u.rfind("file://", 0) == 0) u = u.substr(7);
        else if (u.rfind("file:", 0) == 0) u = u.substr(5);
        if (u.find("://") != std::string::npos)
          throw Error(HASTEN_ERR_UNSUPPORTED, "mlflow: MLFLOW_TRACKING_URI '" + without_credentials(uri) +
                                                  "' is not a local file store (allowed: a directory or a file: URI)");
        root = u;
      } else {
        root = fs::path(run.logging_dir) / "mlruns";
      }
    }
    store_ = std::make_unique<mf::FileStore>(root);
    const std::string experiment = store_->experiment(experiment_name_.empty() ? run.project : experiment_name_);
    std::string name = run_name_;
    if (name.empty()) {
      char stamp[32];
      const std::time_t t = std::time(nullptr);
      std::tm tm{};
      ::localtime_r(&t, &tm);
      std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm);
      name = std::string(run.project) + "-" + stamp;
    }
    const std::string user = user_name();
    run_dir_ = store_->create_run(experiment, mf::new_run_id(), name, user, mf::now_ms());
    mf::FileStore::write_value(run_dir_ / "tags" / "mlflow.runName", name);
    mf::FileStore::write_value(run_dir_ / "tags" / "mlflow.user", user);
    mf::FileStore::write_value(run_dir_ / "tags" / "mlflow.source.name", program_path());
    mf::FileStore::write_value(run_dir_ / "tags" / "mlflow.source.type", "LOCAL");
    const auto hparams = nlohmann::json::parse(run.hparams_json ? run.hparams_json : "{}", nullptr, false);
    if (hparams.is_object())
      for (auto it = hparams.begin(); it != hparams.end(); ++it)
        mf::FileStore::write_value(run_dir_ / "params" / mf::sanitize_key(it.key()), param_text(it.value()));
  }

  void log_scalars(const hasten_scalar* values, uint32_t n, int64_t step) override {
    if (store_ == nullptr) throw Error(HASTEN_ERR_INVALID_USAGE, "mlflow tracker: log before start");
    const int64_t t = mf::now_ms();
    for (uint32_t i = 0; i < n; ++i)
      // step < 0 (none given) is MLflow's default step 0; NaN and infinities are written as
      // nan/inf, which MLflow reads back with float().
      mf::FileStore::append_metric(run_dir_ / "metrics" / mf::sanitize_key(values[i].name), t, values[i].value,
                                   step < 0 ? 0 : step);
  }

  void finish(hasten_status status) override {
    if (store_ == nullptr || ended_) return;
    ended_ = true;
    store_->end_run(run_dir_, status == HASTEN_OK ? mf::RunStatus::Finished : mf::RunStatus::Failed, mf::now_ms());
  }

 private:
  std::string tracking_dir_, experiment_name_, run_name_;
  std::unique_ptr<mf::FileStore> store_;
  fs::path run_dir_;
  bool ended_ = false;
};

using hasten::sdk::OptionSpec;

constexpr hasten_option_spec kOptions[] = {
    OptionSpec("tracking_dir", HASTEN_OPTION_STRING,
               "The file store's root (default: MLFLOW_TRACKING_URI when it is a local path, else <logging_dir>/<project>/mlruns)"),
    OptionSpec("experiment_name", HASTEN_OPTION_STRING, "Experiment of the runs (default: the project name)"),
    OptionSpec("run_name", HASTEN_OPTION_STRING, "The run's mlflow.runName (default <project>-<YYYYmmdd-HHMMSS>)"),
};

constexpr hasten_plugin_descriptor kMlflow = hasten::sdk::with_options(
    hasten::sdk::tracker_descriptor<MlflowTracker>(
        "mlflow", "1.0", "MLflow local file store (mlruns/): params, metrics, tags and the run's final status"),
    kOptions);

}  // namespace

HASTEN_PLUGIN_LIBRARY(&kMlflow)
