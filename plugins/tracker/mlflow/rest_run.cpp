#include "rest_run.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iterator>
#include <system_error>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include "artifacts.hpp"
#include "file_store.hpp"
#include "rest_client.hpp"

namespace hasten::mlflow {

namespace {

// MLflow's log-batch limits (mlflow/utils/validation.py).
constexpr size_t kMaxMetrics = 1000, kMaxParamsOrTags = 100;
// MLflow's longest param value, in characters; its clients cut longer ones too
// (MLFLOW_TRUNCATE_LONG_VALUES). And its longest key (a database column of 250).
constexpr size_t kMaxParamValue = 6000, kMaxKey = 250;

// s cut to at most n characters (UTF-8: never inside a character).
std::string cut_characters(const std::string& s, size_t n) {
  size_t chars = 0, i = 0;
  for (; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) {  // a character starts here
      if (chars == n) break;
      ++chars;
    }
  }
  return s.substr(0, i);
}

size_t characters(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// A double as MLflow's JSON (protobuf's) reads it: NaN and the infinities as strings.
nlohmann::json metric_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  return v;
}

std::string url_encode(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

}  // namespace

RestRun::RestRun(Settings settings, Identity identity)
    : settings_(std::move(settings)), identity_(std::move(identity)), token_(new_run_id()) {
  std::error_code ec;
  std::filesystem::create_directories(settings_.journal.parent_path(), ec);
  // Locked before it has its name, so that a later run replaying journals never takes a live
  // one (journal_replay.cpp): the lock stays with the file through the rename.
  const std::string fresh = settings_.journal.string() + ".new";
  lock_fd_ = ::open(fresh.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ >= 0 && (::flock(lock_fd_, LOCK_EX) != 0 || ::rename(fresh.c_str(), settings_.journal.c_str()) != 0)) {
    ::close(lock_fd_);
    lock_fd_ = -1;
  }
  journal_.open(settings_.journal, std::ios::app);
  artifacts_ = settings_.journal;
  artifacts_.replace_extension(".artifacts");
  if (!journal_)
    settings_.warn("cannot write the journal " + settings_.journal.string() +
                   "; records are kept in memory only until the server takes them");
  std::lock_guard<std::mutex> lock(mu_);
  journal({{"run", {{"experiment", identity_.experiment}, {"run_name", identity_.run_name},
                    {"tracking_uri", without_credentials(settings_.uri)}, {"start_time", identity_.start_ms},
                    {"user", identity_.user},
                    {"hasten.run_token", token_}}}});
  identity_.tags.emplace_back("hasten.run_token", token_);
  for (auto& [key, value] : identity_.params) {
    if (characters(value) > kMaxParamValue) {
      settings_.warn("param '" + key + "' is " + std::to_string(characters(value)) + " characters long; MLflow keeps " +
                     std::to_string(kMaxParamValue) + ", the rest is cut");
      value = cut_characters(value, kMaxParamValue);
    }
    queue_.push_back({Record::Param, {{"key", key}, {"value", value}}, {}});
    journal({{"param", queue_.back().entry}});
  }
  for (const auto& [key, value] : identity_.tags) {
    queue_.push_back({Record::Tag, {{"key", key}, {"value", value}}, {}});
    journal({{"tag", queue_.back().entry}});
  }
  queued_ = queue_.size();
  sender_ = std::thread([this] { run(); });
}

RestRun::RestRun(Settings settings, ReplayTag) : settings_(std::move(settings)), replay_(true) {
  artifacts_ = settings_.journal;
  artifacts_.replace_extension(".artifacts");
}

RestRun::~RestRun() {
  if (sender_.joinable()) finish(false, 0);
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

void RestRun::journal(const nlohmann::json& line) {
  if (!journal_.is_open()) return;
  // Invalid UTF-8 in a name or value is written replaced, never thrown from a log call.
  journal_ << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  journal_.flush();  // a crash keeps what was logged
}

void RestRun::log_metrics(const std::vector<std::pair<std::string, double>>& values, int64_t step) {
  const int64_t t = now_ms();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, value] : values) {
      if (characters(key) > kMaxKey && warned_keys_.insert(key).second)
        settings_.warn("metric '" + key.substr(0, 40) + "...' has a name over MLflow's " + std::to_string(kMaxKey) +
                       " characters; it is sent cut to that");
      queue_.push_back({Record::Metric, {{"key", cut_characters(key, kMaxKey)}, {"value", metric_value(value)},
                                         {"timestamp", t}, {"step", step}}, {}});
      journal({{"metric", queue_.back().entry}});
    }
    queued_ += values.size();
  }
  cv_.notify_one();
}

void RestRun::log_tag(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back({Record::Tag, {{"key", key}, {"value", value}}, {}});
    journal({{"tag", queue_.back().entry}});
    ++queued_;
  }
  cv_.notify_one();
}

void RestRun::log_artifact(const std::string& path, std::string bytes) {
  Record record{Record::Artifact, {{"path", path}}, {}};
  // The bytes go to a file beside the journal, so that a long outage holds no images in
  // memory and a run that ends before the server answers keeps them; a file that cannot be
  // written keeps them in memory.
  const std::filesystem::path file = artifacts_ / path;
  std::error_code ec;
  std::filesystem::create_directories(file.parent_path(), ec);
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (out) record.entry["file"] = file.string();
  else record.bytes = std::move(bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(record));
    journal({{"artifact", queue_.back().entry}});
    ++queued_;
  }
  cv_.notify_one();
}

std::vector<std::pair<std::string, std::string>> RestRun::run_info(double wait_s) {
  std::unique_lock<std::mutex> lock(mu_);
  drained_.wait_for(lock, std::chrono::milliseconds(static_cast<int64_t>(wait_s * 1000)),
                    [&] { return !made_run_id_.empty() || stop_; });
  std::vector<std::pair<std::string, std::string>> info{{"tracking_uri", without_credentials(settings_.uri)},
                                                         {"experiment_name", identity_.experiment},
                                                         {"run_name", identity_.run_name},
                                                         {"run_token", token_},
                                                         {"journal", settings_.journal.string()}};
  if (!made_run_id_.empty()) {
    info.emplace_back("run_id", made_run_id_);
    info.emplace_back("experiment_id", made_experiment_id_);
    info.emplace_back("artifact_uri", made_artifact_uri_);
  }
  return info;
}

void RestRun::finish(bool finished, double wait_s) {
  if (!sender_.joinable()) return;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(wait_s * 1000));
  bool done = false;
  uint64_t unsent = 0, refused = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!replay_) {  // a replayed run ends as its journal says
      final_status_ = finished ? "FINISHED" : "FAILED";
      end_ms_ = now_ms();
      journal({{"status", final_status_}, {"end_time", end_ms_}});
    }
    cv_.notify_one();
    done = drained_.wait_until(lock, deadline, [&] { return queue_.empty() && status_sent_; });
    stop_ = true;
    abort_ = true;  // a call in progress ends now: the end is bounded by flush_timeout
  }
  cv_.notify_one();
  sender_.join();
  unsent = queue_.size();
  refused = refused_;
  journal_.close();
  const std::string uri = without_credentials(settings_.uri);
  if (!done) {
    settings_.warn("" + std::to_string(unsent) + " of " + std::to_string(queued_) +
                   " records" + (status_sent_ ? "" : " and the run's final status") + " did not reach " + uri +
                   " within " + std::to_string(static_cast<int64_t>(wait_s)) + " s at the end of the run; every record is kept in " +
                   settings_.journal.string());
  } else if (refused > 0) {
    settings_.warn("" + uri + " refused " + std::to_string(refused) + " records; every record is kept in " +
                   settings_.journal.string());
  } else {
    std::error_code ec;
    std::filesystem::remove(settings_.journal, ec);  // all on the server: nothing to keep
    std::filesystem::remove_all(artifacts_, ec);
    std::filesystem::remove(settings_.journal.parent_path(), ec);  // only when no other journal is there
  }
}

void RestRun::run() {
  client_ = std::make_unique<RestClient>(settings_.uri, settings_.request_timeout_ms, &abort_);
  auto backoff = std::chrono::milliseconds(250);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    auto has_work = [&] { return run_id_.empty() || !queue_.empty() || (!final_status_.empty() && !status_sent_); };
    cv_.wait(lock, [&] { return stop_ || has_work(); });
    if (stop_) return;
    lock.unlock();
    bool ok = false;
    try {
      ok = send_next();
    } catch (const std::exception& e) {  // an answer without the fields MLflow's API has
      failed(std::string("an answer it could not read: ") + e.what());
    }
    lock.lock();
    if (!run_id_.empty() && made_run_id_.empty()) {  // published for run_info
      made_run_id_ = run_id_;
      made_experiment_id_ = experiment_id_;
      made_artifact_uri_ = artifact_uri_;
      drained_.notify_all();
    }
    if (ok) {
      backoff = std::chrono::milliseconds(250);
      if (queue_.empty() && status_sent_) drained_.notify_all();
    } else {
      cv_.wait_for(lock, backoff, [&] { return stop_; });
      backoff = std::min<std::chrono::milliseconds>(backoff * 2, std::chrono::milliseconds(4000));
    }
  }
}

bool RestRun::send_next() {
  bool pending = false, status_due = false, artifact = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending = !queue_.empty();
    artifact = pending && queue_.front().kind == Record::Artifact;
    status_due = !final_status_.empty() && !status_sent_;
  }
  bool ok = true;
  if (run_id_.empty()) ok = set_up();
  else if (artifact) ok = send_artifact();
  else if (pending) ok = send_batch();
  else if (status_due) ok = send_status();
  if (ok && outage_) {
    outage_ = false;
    settings_.info("" + without_credentials(settings_.uri) + " answers again; sending the kept records");
  }
  return ok;
}

void RestRun::failed(const std::string& why) {
  if (outage_) return;
  outage_ = true;
  settings_.warn("the tracking server " + without_credentials(settings_.uri) + " did not take the run's records (" +
                 why + "); they are kept in " + settings_.journal.string() + " and sent when it answers");
}

bool RestRun::set_up() {
  RestClient& client = *client_;
  if (experiment_id_.empty()) {
    auto r = client.get("experiments/get-by-name", "experiment_name=" + url_encode(identity_.experiment));
    if (r.ok()) {
      experiment_id_ = r.body["experiment"]["experiment_id"].get<std::string>();
    } else if (r.error_code() == "RESOURCE_DOES_NOT_EXIST") {
      auto c = client.post("experiments/create", {{"name", identity_.experiment}});
      if (c.ok()) {
        experiment_id_ = c.body["experiment_id"].get<std::string>();
      } else if (c.error_code() != "RESOURCE_ALREADY_EXISTS") {  // another run made it: look again
        failed("experiments/create: " + c.describe());
        return false;
      }
      if (experiment_id_.empty()) return false;
    } else {
      failed("experiments/get-by-name: " + r.describe());
      return false;
    }
  }
  if (abort_) return false;
  if (create_tried_) {
    // The last create went out and no answer came back: it may have made the run.
    auto s = client.post("runs/search", {{"experiment_ids", {experiment_id_}},
                                         {"filter", "tags.`hasten.run_token` = '" + token_ + "'"},
                                         {"max_results", 1}});
    if (!s.ok()) {
      failed("runs/search: " + s.describe());
      return false;
    }
    if (s.body.contains("runs") && !s.body["runs"].empty()) {
      run_id_ = s.body["runs"][0]["info"]["run_id"].get<std::string>();
      artifact_uri_ = s.body["runs"][0]["info"].value("artifact_uri", "");
      return true;
    }
  }
  if (abort_) return false;
  create_tried_ = true;
  // once: never resent by libcurl itself (rest_client.hpp), so that a lost answer comes back
  // here as a failure and the next try searches for the token instead of making a second run.
  auto r = client.post("runs/create",
                       {{"experiment_id", experiment_id_},
                        {"user_id", identity_.user},
                        {"run_name", identity_.run_name},
                        {"start_time", identity_.start_ms},
                        {"tags", {{{"key", "hasten.run_token"}, {"value", token_}}}}},
                       /*once=*/true);
  if (!r.ok()) {
    failed("runs/create: " + r.describe());
    return false;
  }
  run_id_ = r.body["run"]["info"]["run_id"].get<std::string>();
  artifact_uri_ = r.body["run"]["info"].value("artifact_uri", "");
  return true;
}

bool RestRun::send_batch() {
  // Params and tags go apart from metrics, so that a refused param (MLflow refuses a param
  // logged again with another value) does not take metrics with it.
  nlohmann::json params = nlohmann::json::array(), tags = nlohmann::json::array(), metrics = nlohmann::json::array();
  size_t n = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Record::Kind kind = queue_.front().kind;
    const size_t limit = kind == Record::Metric ? kMaxMetrics : kMaxParamsOrTags;
    for (; n < queue_.size() && n < limit && queue_[n].kind == kind; ++n)
      (kind == Record::Param ? params : kind == Record::Tag ? tags : metrics).push_back(queue_[n].entry);
  }
  RestClient& client = *client_;
  auto r = client.post("runs/log-batch", {{"run_id", run_id_}, {"metrics", metrics}, {"params", params}, {"tags", tags}});
  if (!r.ok() && !r.refused()) {
    failed("runs/log-batch: " + r.describe());
    return false;
  }
  std::lock_guard<std::mutex> lock(mu_);
  queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
  if (r.ok()) {
    sent_ += n;
  } else {
    refused_ += n;
    settings_.warn("" + without_credentials(settings_.uri) + " refused " + std::to_string(n) + " records (" +
                   r.describe() + "); they stay in " + settings_.journal.string());
  }
  return true;
}

bool RestRun::send_artifact() {
  std::string path, file, bytes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Record& front = queue_.front();
    path = front.entry["path"].get<std::string>();
    file = front.entry.value("file", "");
    bytes = front.bytes;
  }
  if (!file.empty()) {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const ArtifactRoot root = parse_artifact_uri(artifact_uri_);
  std::string refusal;  // why this artifact cannot be stored, whatever the server's health
  if (root.kind == ArtifactRoot::Proxy) {
    auto r = client_->put_artifact(root.path + "/" + path, bytes);
    if (!r.ok() && !r.refused()) {
      failed("mlflow-artifacts " + path + ": " + r.describe());
      return false;
    }
    if (!r.ok()) refusal = "its artifact proxy refused " + path + " (" + r.describe() + ")";
  } else if (root.kind == ArtifactRoot::Local) {
    // The server keeps artifacts in a directory and leaves clients to write there (mlflow
    // server --no-serve-artifacts with a local root): reachable when it is on this machine.
    const std::filesystem::path target = std::filesystem::path(root.path) / path;
    std::error_code ec;
    std::filesystem::create_directories(target.parent_path(), ec);
    std::ofstream out(target, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) refusal = "the run's artifact directory " + root.path + " cannot be written here";
  } else {
    refusal = "the run's artifact_uri '" + artifact_uri_ +
              "' is neither the server's artifact proxy (mlflow-artifacts:) nor a local directory";
  }
  std::lock_guard<std::mutex> lock(mu_);
  queue_.pop_front();
  if (refusal.empty()) {
    ++sent_;
  } else {
    ++refused_;
    if (!warned_artifact_store_) {
      warned_artifact_store_ = true;
      settings_.warn("artifacts not stored: " + refusal + "; they stay in " + artifacts_.string());
    }
  }
  return true;
}

bool RestRun::send_status() {
  std::string status;
  int64_t end = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    status = final_status_;
    end = end_ms_;
  }
  RestClient& client = *client_;
  auto r = client.post("runs/update", {{"run_id", run_id_}, {"status", status}, {"end_time", end}});
  if (!r.ok()) {
    failed("runs/update: " + r.describe());
    return false;
  }
  std::lock_guard<std::mutex> lock(mu_);
  status_sent_ = true;
  return true;
}

}  // namespace hasten::mlflow
