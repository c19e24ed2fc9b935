// One MLflow run on a tracking server, sent through its REST API by a thread of its own, so
// that a slow, refusing or absent server never holds up a training step.
//
// Every record (param, tag, metric, artifact, the final status) is appended to a journal file
// first and queued (an artifact's bytes to a file beside it, <journal>.artifacts/<path>); the sender creates the experiment and the run, then sends the queue in log-batch
// calls (params and tags apart from metrics, MLflow's batch limits) and the artifacts one by
// one, to where the run's artifact_uri says (artifacts.hpp). While the server does not
// answer, the queue waits, one warning says so and where the journal is, and sending resumes
// when it answers again; at the end the tracker waits up to flush_timeout for the rest. A
// journal whose records all reached the server is removed; one that did not stays, named in a
// warning, and the next run against the same server from the same logging directory sends it
// (RestRun::replay, journal_replay.cpp). A live run holds an flock on its journal, so that no
// other process replays it. Resending is idempotent: MLflow drops a metric logged again with the same key,
// step, timestamp and value, and a run whose create call's answer was lost is found again by
// its hasten.run_token tag instead of being created twice.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace hasten::mlflow {

class RestClient;

class RestRun {
 public:
  struct Settings {
    std::string uri;                 // http(s)://host:port[/prefix]
    std::filesystem::path journal;   // the file every record is appended to first
    long request_timeout_ms = 10000; // one REST call
    double flush_timeout_s = 30;     // named in the warning of an end that did not send everything
    std::function<void(const std::string&)> warn, info;  // one line each, to the host's log
  };
  struct Identity {
    std::string experiment, run_name, user;
    int64_t start_ms = 0;
    std::vector<std::pair<std::string, std::string>> tags, params;
  };

  RestRun(Settings settings, Identity identity);  // starts the sender
  // An earlier run's journal (settings.journal) that did not all reach the server: its records
  // queued again, the run found by its token (or made, with its own start time) and ended with
  // the journal's status and end time (FAILED at its last record when the journal has none:
  // its process died). nullptr when another live process holds the journal, the journal names
  // another server or has no run line. finish() then waits for it; a journal sent whole is
  // removed (journal_replay.cpp).
  static std::unique_ptr<RestRun> replay(Settings settings);
  ~RestRun();                                     // ends the run as FAILED, not waiting, unless finish() ran
  RestRun(const RestRun&) = delete;
  RestRun& operator=(const RestRun&) = delete;

  // Queues metrics (key, value) at step, timestamped now. Never blocks on the server.
  void log_metrics(const std::vector<std::pair<std::string, double>>& values, int64_t step);
  // Queues a tag (set again: the server keeps the last value). Never blocks on the server.
  void log_tag(const std::string& key, const std::string& value);
  // Queues an artifact: bytes stored at path (artifacts.hpp) in the run's artifact directory.
  void log_artifact(const std::string& path, std::string bytes);
  // What names the run on the server: its run_id, experiment_id and artifact_uri once the
  // server has made it (waiting wait_s at most for that), and always the run token and URI.
  std::vector<std::pair<std::string, std::string>> run_info(double wait_s);
  // Queues the run's final status (FINISHED or FAILED; a replayed run keeps its journal's) and waits for the queue to be sent,
  // wait_s at most (a call still in progress then is cut off); then stops the sender.
  void finish(bool finished, double wait_s);

 private:
  struct Record {
    enum Kind { Param, Tag, Metric, Artifact } kind;
    nlohmann::json entry;  // {key, value[, timestamp, step]} as log-batch takes it; {path, file} of an artifact
    std::string bytes;     // an artifact whose file could not be written: kept here instead
  };

  struct ReplayTag {};
  RestRun(Settings settings, ReplayTag);     // replay()'s: no journal of its own, no sender yet
  void journal(const nlohmann::json& line);  // under mu_
  void run();                                // the sender thread
  bool send_next();                          // one call: set-up, a batch or the status; false: failed
  bool set_up();
  bool send_batch();
  bool send_status();
  bool send_artifact();
  void failed(const std::string& why);       // an outage began (or goes on)

  Settings settings_;
  Identity identity_;
  std::string token_;  // the hasten.run_token tag: finds a run created by a call whose answer was lost

  std::mutex mu_;
  std::condition_variable cv_;       // work queued, or stop
  std::condition_variable drained_;  // the queue and the status were sent
  std::deque<Record> queue_;
  std::string final_status_;  // "" until finish()
  std::string made_run_id_, made_experiment_id_, made_artifact_uri_;  // the sender's, once the run is made
  int64_t end_ms_ = 0;
  bool status_sent_ = false;
  bool stop_ = false;
  std::atomic<bool> abort_{false};  // set at the deadline: the call in progress ends at once
  std::ofstream journal_;
  std::filesystem::path artifacts_;  // <journal>.artifacts: each queued artifact's bytes
  int lock_fd_ = -1;                 // holds the journal's flock while this run lives
  bool replay_ = false;              // an earlier run's journal, sent again
  uint64_t queued_ = 0, sent_ = 0, refused_ = 0;
  std::set<std::string> warned_keys_;  // metric names over MLflow's length, said once each

  // The sender's own (no lock needed).
  std::unique_ptr<RestClient> client_;  // made on the sender thread, with its connection
  std::string experiment_id_, run_id_, artifact_uri_;
  bool warned_artifact_store_ = false;
  bool create_tried_ = false;  // a runs/create call went out without an answer
  bool outage_ = false;
  std::string last_refusal_;
  std::thread sender_;
};

}  // namespace hasten::mlflow
