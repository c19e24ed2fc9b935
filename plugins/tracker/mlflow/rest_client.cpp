#include "rest_client.hpp"

#include <curl/curl.h>

#include <cctype>
#include <cstdlib>
#include <mutex>
#include <string>

namespace hasten::mlflow {

namespace {

// libcurl's progress callback: a non-zero return ends the transfer.
int aborted(void* flag, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return static_cast<const std::atomic<bool>*>(flag)->load() ? 1 : 0;
}

size_t append(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

bool env_true(const char* name) {
  const std::string v = env(name);
  return v == "1" || v == "true" || v == "True" || v == "TRUE";
}

// Each character but letters, digits, '-', '_', '.', '~' and '/' as %XX.
std::string encode_path(const std::string& path) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : path) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') {
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

std::string without_credentials(const std::string& uri) {
  const size_t scheme = uri.find("://");
  if (scheme == std::string::npos) return uri;
  const size_t start = scheme + 3, end = uri.find_first_of("/?#", start);
  const size_t at = uri.rfind('@', end == std::string::npos ? std::string::npos : end);
  if (at == std::string::npos || at < start) return uri;
  return uri.substr(0, start) + "***@" + uri.substr(at + 1);
}

std::string RestResponse::error_code() const {
  if (body.is_object() && body.contains("error_code") && body["error_code"].is_string())
    return body["error_code"].get<std::string>();
  return "";
}

std::string RestResponse::describe() const {
  if (status == 0) return error.empty() ? "no answer" : error;
  std::string s = "HTTP " + std::to_string(status);
  if (!error_code().empty()) s += " " + error_code();
  if (body.is_object() && body.contains("message") && body["message"].is_string())
    s += ": " + body["message"].get<std::string>().substr(0, 300);
  return s;
}

struct RestClient::Impl {
  CURL* curl = nullptr;
  curl_slist* headers = nullptr;
  std::string base;  // without a trailing '/', credentials taken out
  std::string userpwd;
  long timeout_ms = 10000;
  bool insecure = false;
  const std::atomic<bool>* abort = nullptr;
};

RestClient::RestClient(const std::string& base, long timeout_ms, const std::atomic<bool>* abort)
    : impl_(std::make_unique<Impl>()) {
  impl_->abort = abort;
  // libcurl 7.84+ makes its global set-up thread-safe; once per process all the same.
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  impl_->timeout_ms = timeout_ms;
  std::string b = base;
  // user:password@ in the URI: basic authentication, and out of every URL and message.
  const size_t scheme = b.find("://");
  if (scheme != std::string::npos) {
    const size_t start = scheme + 3, end = b.find_first_of("/?#", start);
    const size_t at = b.rfind('@', end == std::string::npos ? std::string::npos : end);
    if (at != std::string::npos && at >= start) {
      impl_->userpwd = b.substr(start, at - start);
      b = b.substr(0, start) + b.substr(at + 1);
    }
  }
  while (!b.empty() && b.back() == '/') b.pop_back();
  impl_->base = b;
  if (impl_->userpwd.empty() && !env("MLFLOW_TRACKING_USERNAME").empty())
    impl_->userpwd = env("MLFLOW_TRACKING_USERNAME") + ":" + env("MLFLOW_TRACKING_PASSWORD");
  impl_->headers = curl_slist_append(impl_->headers, "Content-Type: application/json");
  if (impl_->userpwd.empty() && !env("MLFLOW_TRACKING_TOKEN").empty())
    impl_->headers = curl_slist_append(impl_->headers, ("Authorization: Bearer " + env("MLFLOW_TRACKING_TOKEN")).c_str());
  impl_->insecure = env_true("MLFLOW_TRACKING_INSECURE_TLS");
  impl_->curl = curl_easy_init();
}

RestClient::~RestClient() {
  if (impl_->curl != nullptr) curl_easy_cleanup(impl_->curl);
  curl_slist_free_all(impl_->headers);
}

RestResponse RestClient::post(const std::string& endpoint, const nlohmann::json& body, bool once) {
  const std::string text = body.dump();
  return call(impl_->base + "/api/2.0/mlflow/" + endpoint, &text, /*put=*/false, once);
}

RestResponse RestClient::get(const std::string& endpoint, const std::string& query) {
  return call(impl_->base + "/api/2.0/mlflow/" + endpoint + (query.empty() ? "" : "?" + query), nullptr);
}

RestResponse RestClient::put_artifact(const std::string& path, const std::string& bytes) {
  return call(impl_->base + "/api/2.0/mlflow-artifacts/artifacts/" + encode_path(path), &bytes, /*put=*/true);
}

RestResponse RestClient::call(const std::string& url, const std::string* body, bool put, bool once) {
  RestResponse r;
  CURL* c = impl_->curl;
  if (c == nullptr) {
    r.error = "libcurl could not make a handle";
    return r;
  }
  curl_easy_reset(c);
  std::string received;
  char error[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, impl_->headers);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &append);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &received);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, impl_->timeout_ms);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, std::min(impl_->timeout_ms, 5000L));
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);  // a worker thread: no SIGALRM for timeouts
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  // libcurl resends a request on a fresh connection when a reused one dies before any byte of
  // the answer (a server or proxy that closes it after acting on the request, its answer lost),
  // without telling the caller; only a request on a new connection is never resent (libcurl
  // 8.16's CURLOPT_FORBID_RETRY_ON_REUSE is newer than Debian 12's 7.88). A runs/create sent
  // twice made two runs, one left RUNNING and empty (tests/integration/test_mlflow_edges.py);
  // sent once, a lost answer is a failed call and the run is found by its token.
  if (once) curl_easy_setopt(c, CURLOPT_FRESH_CONNECT, 1L);
  if (impl_->abort != nullptr) {
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, &aborted);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, const_cast<std::atomic<bool>*>(impl_->abort));
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  }
  if (!impl_->userpwd.empty()) {
    curl_easy_setopt(c, CURLOPT_HTTPAUTH, CURLAUTH_BASIC);
    curl_easy_setopt(c, CURLOPT_USERPWD, impl_->userpwd.c_str());
  }
  if (impl_->insecure) {
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 0L);
  }
  if (body != nullptr) {
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    // The artifact proxy takes the file's bytes as the body of a PUT (the header's JSON
    // content type is not read by it).
    if (put) curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, "PUT");
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body->data());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body->size()));
  }
  const CURLcode rc = curl_easy_perform(c);
  if (rc != CURLE_OK) {
    r.error = error[0] != '\0' ? std::string(error) : std::string(curl_easy_strerror(rc));
    return r;
  }
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
  r.body = nlohmann::json::parse(received, nullptr, /*allow_exceptions=*/false);
  if (r.body.is_discarded()) r.body = nullptr;
  if (r.status >= 400 && !r.body.is_object() && !received.empty()) r.body = {{"message", received.substr(0, 300)}};
  return r;
}

}  // namespace hasten::mlflow
