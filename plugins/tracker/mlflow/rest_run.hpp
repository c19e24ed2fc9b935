// One MLflow run on a tracking server, sent through its REST API by a thread of its own, so
// that a slow, refusing or absent server never holds up a training step.
//
// Every record (param, tag, metric, the final status) is appended to a journal file first and
// queued; the sender creates the experiment and the run, then sends the queue in log-batch
// calls (params and tags apart from metrics, MLflow's batch limits). While the server does not
// answer, the queue waits, one warning says so and where the journal is, and sending resumes
// when it answers again; at the end the tracker waits up to flush_timeout for the rest. A
// journal whose records all reached the server is removed; one that did not stays, named in a
// warning. Resending is idempotent: MLflow drops a metric logged again with the same key,
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
  ~RestRun();                                     // ends the run as FAILED, not waiting, unless finish() ran
  RestRun(const RestRun&) = delete;
  RestRun& operator=(const RestRun&) = delete;

  // Queues metrics (key, value) at step, timestamped now. Never blocks on the server.
  void log_metrics(const std::vector<std::pair<std::string, double>>& values, int64_t step);
  // Queues the run's final status (FINISHED or FAILED) and waits for the queue to be sent,
  // wait_s at most (a call still in progress then is cut off); then stops the sender.
  void finish(bool finished, double wait_s);

 private:
  struct Record {
    enum Kind { Param, Tag, Metric } kind;
    nlohmann::json entry;  // {key, value[, timestamp, step]} as log-batch takes it
  };

  void journal(const nlohmann::json& line);  // under mu_
  void run();                                // the sender thread
  bool send_next();                          // one call: set-up, a batch or the status; false: failed
  bool set_up();
  bool send_batch();
  bool send_status();
  void failed(const std::string& why);       // an outage began (or goes on)

  Settings settings_;
  Identity identity_;
  std::string token_;  // the hasten.run_token tag: finds a run created by a call whose answer was lost

  std::mutex mu_;
  std::condition_variable cv_;       // work queued, or stop
  std::condition_variable drained_;  // the queue and the status were sent
  std::deque<Record> queue_;
  std::string final_status_;  // "" until finish()
  int64_t end_ms_ = 0;
  bool status_sent_ = false;
  bool stop_ = false;
  std::atomic<bool> abort_{false};  // set at the deadline: the call in progress ends at once
  std::ofstream journal_;
  uint64_t queued_ = 0, sent_ = 0, refused_ = 0;
  std::set<std::string> warned_keys_;  // metric names over MLflow's length, said once each

  // The sender's own (no lock needed).
  std::unique_ptr<RestClient> client_;  // made on the sender thread, with its connection
  std::string experiment_id_, run_id_;
  bool create_tried_ = false;  // a runs/create call went out without an answer
  bool outage_ = false;
  std::string last_refusal_;
  std::thread sender_;
};

}  // namespace hasten::mlflow
