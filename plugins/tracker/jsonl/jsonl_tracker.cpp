// Tracker "jsonl": metrics.jsonl in the run's logging directory, one JSON object per line,
// flushed per line:
//   {"type":"hparams","time":T,"project":P,"hparams":{...}}
//   {"type":"metrics","step":S,"time":T,"loss":0.5,...}
//     (NaN and infinities as the bare tokens NaN, Infinity and -Infinity, which Python's
//      json module writes and reads back as the same floats; strict JSON has no spelling)
//   {"type":"text","step":S,"time":T,"name":N,"text":X}
//   {"type":"end","time":T,"status":"ok"|"failed"}
// C tier: no LibTorch.
#include <hasten/plugin.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>

namespace {

using ordered_json = nlohmann::ordered_json;

double now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

class JsonlTracker final : public hasten::sdk::Tracker {
 public:
  JsonlTracker(const hasten_host_api* host, std::string_view options) : Tracker(host) {
    auto j = nlohmann::json::parse(options, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.empty())
      throw hasten::sdk::Error(HASTEN_ERR_INVALID_ARGUMENT,
                               "tracker 'jsonl' takes no options, got " + std::string(options));
  }

  void start(const hasten_tracker_run& run) override {
    path_ = std::string(run.logging_dir) + "/metrics.jsonl";
    out_.open(path_, std::ios::app);
    if (!out_)
      throw hasten::sdk::Error(HASTEN_ERR_SYSTEM, "cannot open " + path_ + ": " + std::strerror(errno));
    auto hparams = ordered_json::parse(run.hparams_json ? run.hparams_json : "{}", nullptr, false);
    if (hparams.is_discarded()) hparams = ordered_json::object();
    write({{"type", "hparams"}, {"time", now()}, {"project", run.project}, {"hparams", hparams}});
  }

  std::string run_info() override { return ordered_json{{"file", path_}}.dump(); }

  void log_scalars(const hasten_scalar* values, uint32_t n, int64_t step) override {
    // Written member by member: nlohmann-json would turn a non-finite value into null.
    ordered_json head = {{"type", "metrics"}};
    if (step >= 0) head["step"] = step;
    head["time"] = now();
    std::string line = head.dump();
    line.pop_back();  // the closing brace
    for (uint32_t i = 0; i < n; ++i) {
      const double v = values[i].value;
      line += ',' + ordered_json(values[i].name).dump() + ':';
      line += std::isnan(v) ? "NaN" : std::isinf(v) ? (v > 0 ? "Infinity" : "-Infinity") : ordered_json(v).dump();
    }
    write(line + '}');
  }

  void log_text(const char* name, const char* text, int64_t step) override {
    ordered_json line = {{"type", "text"}};
    if (step >= 0) line["step"] = step;
    line["time"] = now();
    line["name"] = name;
    line["text"] = text;
    write(line);
  }

  void flush() override { out_.flush(); }

  void finish(hasten_status status) override {
    if (!out_.is_open()) return;
    write({{"type", "end"}, {"time", now()}, {"status", status == HASTEN_OK ? "ok" : "failed"}});
    out_.close();
  }

 private:
  void write(const ordered_json& line) { write(line.dump()); }
  void write(const std::string& line) {
    if (!out_.is_open())
      throw hasten::sdk::Error(HASTEN_ERR_INVALID_USAGE, "jsonl tracker: log before start");
    out_ << line << '\n';
    out_.flush();
    if (!out_) throw hasten::sdk::Error(HASTEN_ERR_SYSTEM, "cannot write " + path_);
  }

  std::string path_;
  std::ofstream out_;
};

constexpr hasten_plugin_descriptor kJsonl = hasten::sdk::tracker_descriptor<JsonlTracker>(
    "jsonl", "1.0", "metrics.jsonl: one JSON object per log call");

}  // namespace

HASTEN_PLUGIN_LIBRARY(&kJsonl)
