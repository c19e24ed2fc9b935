// Tracker "mlflow": one MLflow run per init_trackers call, on a tracking server through its
// REST API (rest_run.hpp: a thread of its own, a journal on disk) or in MLflow's local file
// store (file_store.hpp), in the experiment named after the project: hyperparameters as
// params, scalars as metrics, mlflow.runName/user/source tags, and at the end the run's status
// and end_time: FINISHED after end_training, FAILED when the run ended without it (the engine
// destroys its trackers without finish() only when training did not reach end_training).
// Images (PNG), tables (mlflow.log_table's JSON) and text are the run's artifacts, at the
// paths of artifacts.hpp; MLflow has no histograms, so the tracker has no log_histogram.
// C tier: no LibTorch.
#include <hasten/plugin.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <pwd.h>
#include <string>
#include <unistd.h>

#include "artifacts.hpp"
#include "file_store.hpp"
#include "png/png_encode.hpp"
#include "rest_client.hpp"
#include "rest_run.hpp"

namespace {

using hasten::mlflow::without_credentials;

bool is_server(const std::string& uri) { return uri.rfind("http://", 0) == 0 || uri.rfind("https://", 0) == 0; }

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

// The longest waits for a tracking server at the end of a run: the tracker host process's
// answer to finish must come within 60 s and its exit within 30 s (running_tracker.cpp), or it
// is stopped as hung, with the warning that names the journal unsaid.
constexpr double kMaxFlushTimeoutS = 45, kUnfinishedWaitS = 10;
// How long get_tracker waits for a tracking server to make the run (its run_id).
constexpr double kRunInfoWaitS = 5;
// The tag through which mlflow.load_table finds tables, and MLflow's limit on a tag's value
// (characters; the bytes counted here are never fewer).
constexpr const char* kLoggedArtifacts = "mlflow.loggedArtifacts";
constexpr std::size_t kMaxTagValue = 8000;

class MlflowTracker final : public hasten::sdk::Tracker {
 public:
  MlflowTracker(const hasten_host_api* host, std::string_view options) : Tracker(host) {
    const hasten::sdk::Options in(host, options);  // keys and types checked against kOptions
    tracking_dir_ = in.text("tracking_dir").value_or("");
    tracking_uri_ = in.text("tracking_uri").value_or("");
    experiment_name_ = in.text("experiment_name").value_or("");
    run_name_ = in.text("run_name").value_or("");
    flush_timeout_s_ = in.number("flush_timeout").value_or(30.0);
    if (!tracking_dir_.empty() && !tracking_uri_.empty())
      throw Error(HASTEN_ERR_INVALID_ARGUMENT, "mlflow: tracking_dir and tracking_uri both given (allowed: one of them)");
    if (!tracking_uri_.empty() && !is_server(tracking_uri_))
      throw Error(HASTEN_ERR_INVALID_ARGUMENT, "mlflow: tracking_uri '" + without_credentials(tracking_uri_) +
                                                   "' is not a tracking server (allowed: http://HOST:PORT or https://...; "
                                                   "a local store is tracking_dir)");
  }

  ~MlflowTracker() override {
    if (server_ != nullptr) {
      // The run ended without end_training: a shorter wait, inside the tracker host's own
      // limit for a process whose training program has gone (running_tracker.cpp).
      if (!ended_) {
        const double wait = std::min(flush_timeout_s_, kUnfinishedWaitS);
        const auto deadline = std::chrono::steady_clock::now() +
                              std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(wait));
        server_->finish(false, wait);
        finish_replays(deadline);
      }
      return;
    }
    if (store_ == nullptr || ended_) return;
    try {
      store_->end_run(run_dir_, mf::RunStatus::Failed, mf::now_ms());
    } catch (...) {
      // destroy() never fails; a write error here has nowhere to go.
    }
  }

  void start(const hasten_tracker_run& run) override {
    // Where: the tracking_uri (a server) or tracking_dir (a file store) option, else
    // MLFLOW_TRACKING_URI (a server, a path or a file: URI, as MLflow's clients read it), else
    // <logging_dir>/mlruns.
    std::string server = tracking_uri_;
    fs::path root = tracking_dir_;
    if (server.empty() && root.empty()) {
      if (const char* uri = std::getenv("MLFLOW_TRACKING_URI"); uri && *uri) {
        std::string u = uri;
        if (is_server(u)) server = u;
        else if (u.rfind("file://", 0) == 0) root = u.substr(7);
        else if (u.rfind("file:", 0) == 0) root = u.substr(5);
        else if (u.find("://") == std::string::npos) root = u;
        else
          throw Error(HASTEN_ERR_UNSUPPORTED, "mlflow: MLFLOW_TRACKING_URI '" + without_credentials(uri) +
                                                  "' is neither a tracking server nor a local store (allowed: "
                                                  "http(s)://HOST:PORT, a directory or a file: URI)");
      } else {
        root = fs::path(run.logging_dir) / "mlruns";
      }
    }
    const std::string experiment = experiment_name_.empty() ? std::string(run.project) : experiment_name_;
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
    std::vector<std::pair<std::string, std::string>> tags{
        {"mlflow.runName", name}, {"mlflow.user", user}, {"mlflow.source.name", program_path()}, {"mlflow.source.type", "LOCAL"}};
    std::vector<std::pair<std::string, std::string>> params;
    const auto hparams = nlohmann::json::parse(run.hparams_json ? run.hparams_json : "{}", nullptr, false);
    if (hparams.is_object())
      for (auto it = hparams.begin(); it != hparams.end(); ++it) params.emplace_back(mf::sanitize_key(it.key()), param_text(it.value()));

    if (!server.empty()) {
      mf::RestRun::Settings settings;
      settings.uri = server;
      settings.journal = fs::path(run.logging_dir) / "mlflow-journal" / (mf::new_run_id() + ".jsonl");
      server_journal_ = settings.journal;
      settings.flush_timeout_s = flush_timeout_s_;
      const hasten_host_api* host = this->host();
      settings.warn = [host](const std::string& m) { hasten::sdk::log(host, HASTEN_LOG_WARN, "mlflow", m); };
      settings.info = [host](const std::string& m) { hasten::sdk::log(host, HASTEN_LOG_INFO, "mlflow", m); };
      const fs::path journals = settings.journal.parent_path();
      mf::RestRun::Settings replay_settings = settings;
      server_ = std::make_unique<mf::RestRun>(std::move(settings),
                                              mf::RestRun::Identity{experiment, name, user, mf::now_ms(), tags, params});
      replay_journals(journals, std::move(replay_settings));
      return;
    }
    store_root_ = fs::absolute(root);
    experiment_ = experiment;
    run_name_used_ = name;
    store_ = std::make_unique<mf::FileStore>(root);
    run_dir_ = store_->create_run(store_->experiment(experiment), mf::new_run_id(), name, user, mf::now_ms());
    for (const auto& [key, value] : tags) mf::FileStore::write_value(run_dir_ / "tags" / key, value);
    for (const auto& [key, value] : params) mf::FileStore::write_value(run_dir_ / "params" / key, value);
  }

  void log_scalars(const hasten_scalar* values, uint32_t n, int64_t step) override {
    if (server_ != nullptr) {
      std::vector<std::pair<std::string, double>> metrics;
      metrics.reserve(n);
      for (uint32_t i = 0; i < n; ++i) metrics.emplace_back(mf::sanitize_key(values[i].name), values[i].value);
      server_->log_metrics(metrics, step < 0 ? 0 : step);  // queued: never waits for the server
      return;
    }
    if (store_ == nullptr) throw Error(HASTEN_ERR_INVALID_USAGE, "mlflow tracker: log before start");
    const int64_t t = mf::now_ms();
    for (uint32_t i = 0; i < n; ++i)
      // step < 0 (none given) is MLflow's default step 0; NaN and infinities are written as
      // nan/inf, which MLflow reads back with float().
      mf::FileStore::append_metric(run_dir_ / "metrics" / mf::sanitize_key(values[i].name), t, values[i].value,
                                   step < 0 ? 0 : step);
  }

  void log_text(const char* name, const char* text, int64_t step) override {
    artifact(mf::artifact_path("text", name, step, "txt"), text);
  }

  void log_image(const char* name, const uint8_t* pixels, uint32_t height, uint32_t width, uint32_t channels,
                 int64_t step) override {
    artifact(mf::artifact_path("images", name, step, "png"),
             hasten::tracker_png::encode_png(pixels, height, width, channels, "mlflow"));
  }

  void log_table(const char* name, const char* table_json, int64_t step) override {
    // The host's table is {"columns": [...], "data": [[...], ...]}: mlflow.log_table's file.
    const std::string path = mf::artifact_path("tables", name, step, "json");
    artifact(path, table_json);
    list_table(path);
  }

  // The server's run_id, experiment_id and artifact_uri (once the server has made the run:
  // up to 5 s for that here), or the file store's; the tracking URI and the run's name.
  std::string run_info() override {
    nlohmann::json j = nlohmann::json::object();
    if (server_ != nullptr) {
      for (auto& [key, value] : server_->run_info(kRunInfoWaitS)) j[key] = value;
    } else if (store_ != nullptr) {
      j = {{"tracking_uri", "file://" + store_root_.string()}, {"experiment_name", experiment_},
           {"experiment_id", run_dir_.parent_path().filename().string()}, {"run_id", run_dir_.filename().string()},
           {"run_name", run_name_used_}, {"artifact_uri", "file://" + (run_dir_ / "artifacts").string()}};
    }
    return j.dump();
  }

  void finish(hasten_status status) override {
    if (ended_) return;
    if (server_ != nullptr) {
      ended_ = true;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                                 std::chrono::duration<double>(flush_timeout_s_));
      server_->finish(status == HASTEN_OK, flush_timeout_s_);
      finish_replays(deadline);
      return;
    }
    if (store_ == nullptr) return;
    ended_ = true;
    store_->end_run(run_dir_, status == HASTEN_OK ? mf::RunStatus::Finished : mf::RunStatus::Failed, mf::now_ms());
  }

 private:
  // The replays share the run's end: whatever time its own records left them.
  void finish_replays(std::chrono::steady_clock::time_point deadline) {
    for (auto& r : replays_)
      r->finish(false, std::max(0.0, std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count()));
    replays_.clear();
  }

  // Journals that earlier runs against this server left in this logging directory (their
  // server was away at their end, or their process died) are sent again beside this run.
  void replay_journals(const fs::path& dir, mf::RestRun::Settings settings) {
    std::error_code ec;
    std::vector<fs::path> found;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
      if (it->path().extension() == ".jsonl" && it->path() != server_journal_) found.push_back(it->path());
    std::sort(found.begin(), found.end());
    for (const auto& path : found) {
      settings.journal = path;
      if (auto run = mf::RestRun::replay(settings)) {
        hasten::sdk::log(host(), HASTEN_LOG_INFO, "mlflow",
                         "sending the records an earlier run left in " + path.string() + " to " +
                             without_credentials(settings.uri));
        replays_.push_back(std::move(run));
      }
    }
  }

  // mlflow.load_table finds a run's tables through its mlflow.loggedArtifacts tag, a JSON list
  // of {"path", "type": "table"} that mlflow.log_table keeps; hasten keeps it the same way, up
  // to MLflow's limit on a tag's value (a table past it is an artifact that load_table misses).
  void list_table(const std::string& path) {
    nlohmann::json entry = {{"path", path}, {"type", "table"}};
    for (const auto& e : logged_tables_)
      if (e == entry) return;
    nlohmann::json grown = logged_tables_;
    grown.push_back(std::move(entry));
    std::string value = grown.dump();
    if (value.size() > kMaxTagValue) {
      if (!tables_full_)
        hasten::sdk::log(host(), HASTEN_LOG_WARN, "mlflow",
                         "table '" + path + "' and later ones are artifacts that mlflow.load_table will not find: the run's " +
                             std::string(kLoggedArtifacts) + " tag is at MLflow's limit of " +
                             std::to_string(kMaxTagValue) + " characters");
      tables_full_ = true;
      return;
    }
    logged_tables_ = std::move(grown);
    if (server_ != nullptr)
      server_->log_tag(kLoggedArtifacts, value);
    else if (store_ != nullptr)
      mf::FileStore::write_value(run_dir_ / "tags" / kLoggedArtifacts, value);
  }

  void artifact(const std::string& path, std::string bytes) {
    if (server_ != nullptr) {
      server_->log_artifact(path, std::move(bytes));  // queued: never waits for the server
      return;
    }
    if (store_ == nullptr) throw Error(HASTEN_ERR_INVALID_USAGE, "mlflow tracker: log before start");
    mf::FileStore::write_artifact(run_dir_ / "artifacts" / path, bytes);
  }

  std::string tracking_dir_, tracking_uri_, experiment_name_, run_name_;
  double flush_timeout_s_ = 30;
  std::unique_ptr<mf::RestRun> server_;  // a tracking server
  fs::path server_journal_;
  std::vector<std::unique_ptr<mf::RestRun>> replays_;  // earlier runs' journals, sent again
  std::unique_ptr<mf::FileStore> store_;  // or a local file store
  fs::path run_dir_, store_root_;
  std::string experiment_, run_name_used_;  // the file store run's, for run_info
  nlohmann::json logged_tables_ = nlohmann::json::array();  // the mlflow.loggedArtifacts tag's value
  bool tables_full_ = false;
  bool ended_ = false;
};

using hasten::sdk::OptionSpec;

constexpr hasten_option_spec kOptions[] = {
    OptionSpec("tracking_uri", HASTEN_OPTION_STRING,
               "A tracking server, http(s)://HOST:PORT (default: MLFLOW_TRACKING_URI when it is one); not with tracking_dir"),
    OptionSpec("tracking_dir", HASTEN_OPTION_STRING,
               "The file store's root (default: MLFLOW_TRACKING_URI when it is a local path, else <logging_dir>/<project>/mlruns)"),
    OptionSpec("flush_timeout", HASTEN_OPTION_FLOAT,
               "Seconds the end of a run waits for a tracking server to take what is still queued (10 at most when the run "
               "ends without end_training)")
        .range(0, kMaxFlushTimeoutS)
        .default_json("30"),
    OptionSpec("experiment_name", HASTEN_OPTION_STRING, "Experiment of the runs (default: the project name)"),
    OptionSpec("run_name", HASTEN_OPTION_STRING, "The run's mlflow.runName (default <project>-<YYYYmmdd-HHMMSS>)"),
};

constexpr hasten_plugin_descriptor kMlflow = hasten::sdk::with_options(
    hasten::sdk::tracker_descriptor<MlflowTracker>(
        "mlflow", "1.2",
        "MLflow tracking server (REST) or local file store: params, metrics, tags, images, tables and text (artifacts) "
        "and the run's final status"),
    kOptions);

}  // namespace

HASTEN_PLUGIN_LIBRARY(&kMlflow)
