// HTTP(S) calls to an MLflow tracking server's REST API (/api/2.0/mlflow/...), through
// libcurl. One client per thread: the mlflow tracker's sender thread owns it.
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <memory>
#include <string>

namespace hasten::mlflow {

// What a call came back with. `status` 0: no HTTP answer (connection refused, reset, timed
// out); `error` then says why. A server's own refusal has its HTTP status, and MLflow's
// error_code and message in the body.
struct RestResponse {
  long status = 0;
  std::string error;       // transport failure (status 0), else empty
  nlohmann::json body;     // the parsed body; null when it was empty or not JSON
  bool ok() const { return status >= 200 && status < 300; }
  // The server answered, but no retry of the same records can succeed (400-499 except 408 and
  // 429, and 401/403: credentials may be renewed, so those wait like an absent server).
  bool refused() const {
    return status >= 400 && status < 500 && status != 408 && status != 429 && status != 401 && status != 403;
  }
  std::string error_code() const;  // MLflow's error_code, e.g. RESOURCE_DOES_NOT_EXIST
  std::string describe() const;    // one line: the HTTP status and MLflow's message, or why nothing came
};

class RestClient {
 public:
  // base: the tracking URI, http(s)://[user:password@]host[:port][/prefix]. Credentials come
  // from the URI, else MLFLOW_TRACKING_USERNAME/PASSWORD (basic), else MLFLOW_TRACKING_TOKEN
  // (bearer), as MLflow's clients read them; MLFLOW_TRACKING_INSECURE_TLS=true skips the
  // certificate check. timeout_ms bounds each call.
  // abort: when it becomes true, a call in progress ends at once (no answer).
  RestClient(const std::string& base, long timeout_ms, const std::atomic<bool>* abort = nullptr);
  ~RestClient();
  RestClient(const RestClient&) = delete;
  RestClient& operator=(const RestClient&) = delete;

  // endpoint: e.g. "runs/log-batch" (under /api/2.0/mlflow/). once: a call that must not
  // reach the server twice (runs/create): it goes on a connection of its own. libcurl sends a
  // request again, unasked, on a new connection when a reused one closes before any answer;
  // the server may have acted on the first one (made the run) all the same.
  RestResponse post(const std::string& endpoint, const nlohmann::json& body, bool once = false);
  RestResponse get(const std::string& endpoint, const std::string& query);
  // An artifact through the server's artifact proxy (mlflow server --serve-artifacts, the
  // default): PUT /api/2.0/mlflow-artifacts/artifacts/<path>, path's segments URL-encoded.
  RestResponse put_artifact(const std::string& path, const std::string& bytes);

 private:
  RestResponse call(const std::string& url, const std::string* body, bool put = false, bool once = false);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The URI without the user:password@ of its authority: what is printed of it.
std::string without_credentials(const std::string& uri);

}  // namespace hasten::mlflow
