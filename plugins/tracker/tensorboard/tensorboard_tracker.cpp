// Tracker "tensorboard": one TensorBoard run directory per init_trackers call,
//   <logging_dir>/<project>/tensorboard/<run_name>/events.out.tfevents.<seconds>.<host>
// holding TFRecord-framed Event messages (hasten_tb/*.proto, TensorFlow's field numbers):
// the brain.Event:2 header, scalars as simple_value, images as PNG (libpng), histograms in
// TensorFlow's default buckets (histogram.cpp), text and tables (as markdown) for the text
// plugin, and the HParams plugin's session start (hyperparameters) and end (status) so the
// HPARAMS tab lists the run with its scalars as metrics. Records are buffered and written every max_queue records, every flush_secs
// seconds (by a timer thread, so that an idle run's last records reach the disk too), on
// flush() and at the end.
// C tier: libprotobuf and nlohmann-json, no LibTorch.
#include <hasten/plugin.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <sys/stat.h>
#include <unistd.h>

#include "hasten_tb/event.pb.h"
#include "hasten_tb/hparams.pb.h"
#include "histogram.hpp"
#include "png/png_encode.hpp"
#include "record_writer.hpp"

namespace {

using hasten::sdk::Error;
namespace tb = hasten::tb;

double now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

// Creates dir (one level); EEXIST is fine unless exclusive. Throws naming the path.
bool make_dir(const std::string& dir, bool exclusive) {
  if (::mkdir(dir.c_str(), 0755) == 0) return true;
  if (errno == EEXIST && !exclusive) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return false;
    throw Error(HASTEN_ERR_SYSTEM, "tensorboard: cannot create directory " + dir + ": it exists and is not a directory");
  }
  if (errno == EEXIST) return false;
  throw Error(HASTEN_ERR_SYSTEM, "tensorboard: cannot create directory " + dir + ": " + std::strerror(errno));
}

google::protobuf::Value hparam_value(const nlohmann::json& v) {
  google::protobuf::Value out;
  if (v.is_boolean()) out.set_bool_value(v.get<bool>());
  else if (v.is_number()) out.set_number_value(v.get<double>());
  else if (v.is_string()) out.set_string_value(v.get<std::string>());
  else out.set_string_value(v.dump());  // HParams shows scalars only: keep the rest readable
  return out;
}

using hasten::sdk::OptionSpec;

// PyTorch SummaryWriter's defaults.
constexpr hasten_option_spec kOptions[] = {
    OptionSpec("flush_secs", HASTEN_OPTION_FLOAT,
               "Write buffered events every this many seconds, logging or not (0: write on every log call)")
        .min(0.0)
        .default_json("120"),
    OptionSpec("max_queue", HASTEN_OPTION_INT, "Write buffered events when this many are waiting").min(1).default_json("10"),
    OptionSpec("run_name", HASTEN_OPTION_STRING,
               "Name of the run directory under <logging_dir>/<project>/tensorboard (default <YYYYmmdd-HHMMSS>_<host>)"),
};

class TensorboardTracker final : public hasten::sdk::Tracker {
 public:
  TensorboardTracker(const hasten_host_api* host, std::string_view options) : Tracker(host) {
    // Keys and types checked against kOptions; an absent key is its default_json there.
    const hasten::sdk::Options in(host, options, kOptions);
    flush_secs_ = in.number("flush_secs").value();
    max_queue_ = in.integer("max_queue").value();
    run_name_ = in.text("run_name").value_or("");
    if (run_name_.find('/') != std::string::npos || run_name_ == "." || run_name_ == "..")
      throw Error(HASTEN_ERR_INVALID_ARGUMENT,
                  "tensorboard options: run_name: expected a directory name without '/', got '" + run_name_ + "'");
  }

  ~TensorboardTracker() override {
    stop_timer();
    // Destroyed without finish(): the run did not reach end_training, which the engine only
    // skips when training ended by an error; the HPARAMS tab shows the session as failed.
    if (!writer_.is_open()) return;
    try {
      end_session(tb::STATUS_FAILURE);
      writer_.close();
    } catch (...) {
      // destroy() never fails; a write error here has nowhere to go.
    }
  }

  void start(const hasten_tracker_run& run) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::string host = hostname();
    const std::string root = std::string(run.logging_dir) + "/tensorboard";
    make_dir(root, false);
    std::string base = run_name_;
    if (base.empty()) {
      char stamp[32];
      const std::time_t t = std::time(nullptr);
      std::tm tm{};
      ::localtime_r(&t, &tm);
      std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm);
      base = std::string(stamp) + "_" + host;
    }
    // One directory per run: a second init_trackers in the same second gets base-2, ...
    run_dir_ = root + "/" + base;
    for (int n = 2; !make_dir(run_dir_, true); ++n) run_dir_ = root + "/" + base + "-" + std::to_string(n);

    char file[64];
    std::snprintf(file, sizeof(file), "events.out.tfevents.%010lld.", static_cast<long long>(std::time(nullptr)));
    event_file_ = run_dir_ + "/" + file + host;
    writer_.open(event_file_);
    last_flush_ = now();

    tb::Event header;
    header.set_wall_time(now());
    header.set_file_version("brain.Event:2");
    write(header);

    tb::HParamsPluginData data;
    auto* start = data.mutable_session_start_info();
    const auto hparams = nlohmann::json::parse(run.hparams_json ? run.hparams_json : "{}", nullptr, false);
    if (hparams.is_object())
      for (auto it = hparams.begin(); it != hparams.end(); ++it) (*start->mutable_hparams())[it.key()] = hparam_value(it.value());
    start->set_start_time_secs(now());
    write_plugin_event("_hparams_/session_start_info", data);
    writer_.flush();  // the run appears in TensorBoard as soon as it starts
    if (flush_secs_ > 0) timer_ = std::thread([this] { flush_periodically(); });
  }

  // `tensorboard --logdir` of log_dir shows the run; event_file is the file it reads.
  std::string run_info() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return nlohmann::json{{"log_dir", run_dir_}, {"event_file", event_file_}}.dump();
  }

  void log_scalars(const hasten_scalar* values, uint32_t n, int64_t step) override {
    std::lock_guard<std::mutex> lock(mutex_);
    tb::Event event = stamped(step);
    for (uint32_t i = 0; i < n; ++i) {
      auto* v = event.mutable_summary()->add_value();
      v->set_tag(values[i].name);
      // simple_value is a float32, as in every TensorBoard writer; NaN and infinities survive.
      v->set_simple_value(static_cast<float>(values[i].value));
    }
    write(event);
    maybe_flush();
  }

  void log_text(const char* name, const char* text, int64_t step) override {
    std::lock_guard<std::mutex> lock(mutex_);
    tb::Event event = stamped(step);
    auto* v = event.mutable_summary()->add_value();
    v->set_tag(name);
    auto* tensor = v->mutable_tensor();
    tensor->set_dtype(tb::DT_STRING);
    tensor->mutable_tensor_shape()->add_dim()->set_size(1);
    tensor->add_string_val(text);
    v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
    write(event);
    maybe_flush();
  }

  void log_image(const char* name, const uint8_t* pixels, uint32_t height, uint32_t width, uint32_t channels,
                 int64_t step) override {
    std::string png = hasten::tracker_png::encode_png(pixels, height, width, channels, "tensorboard");  // outside the lock
    std::lock_guard<std::mutex> lock(mutex_);
    tb::Event event = stamped(step);
    auto* v = event.mutable_summary()->add_value();
    v->set_tag(name);
    auto* image = v->mutable_image();
    image->set_height(static_cast<int32_t>(height));
    image->set_width(static_cast<int32_t>(width));
    image->set_colorspace(static_cast<int32_t>(channels));
    image->set_encoded_image_string(std::move(png));
    write(event);
    maybe_flush();
  }

  void log_histogram(const char* name, const double* values, uint64_t n, int64_t step) override {
    tb::Event event = stamped(step);
    auto* v = event.mutable_summary()->add_value();
    v->set_tag(name);
    hasten::tensorboard::fill_histogram(values, n, *v->mutable_histo());
    std::lock_guard<std::mutex> lock(mutex_);
    write(event);
    maybe_flush();
  }

  // A table as the text plugin shows one: a markdown table.
  void log_table(const char* name, const char* table_json, int64_t step) override {
    const auto table = nlohmann::json::parse(table_json, nullptr, false);
    if (!table.is_object() || !table.contains("columns") || !table.contains("data"))
      throw Error(HASTEN_ERR_INVALID_ARGUMENT, std::string("tensorboard: table '") + name + "' is not {columns, data}");
    auto cell = [](const nlohmann::json& c) {
      std::string text = c.is_string() ? c.get<std::string>() : c.is_null() ? "" : c.dump();
      std::string out;
      for (char ch : text) out += ch == '|' ? std::string("\\|") : ch == '\n' ? std::string(" ") : std::string(1, ch);
      return out;
    };
    std::string md = "|", rule = "|";
    for (const auto& c : table["columns"]) md += " " + cell(c) + " |", rule += " --- |";
    md += "\n" + rule + "\n";
    for (const auto& row : table["data"]) {
      md += "|";
      for (const auto& c : row) md += " " + cell(c) + " |";
      md += "\n";
    }
    log_text(name, md.c_str(), step);
  }

  void flush() override {
    std::lock_guard<std::mutex> lock(mutex_);
    report_timer_error();
    writer_.flush();
  }

  void finish(hasten_status status) override {
    stop_timer();
    std::lock_guard<std::mutex> lock(mutex_);
    if (!writer_.is_open()) return;
    end_session(status == HASTEN_OK ? tb::STATUS_SUCCESS : tb::STATUS_FAILURE);
    writer_.close();
  }

 private:
  // step < 0 (none given) is written as step 0, as PyTorch's SummaryWriter does.
  static tb::Event stamped(int64_t step) {
    tb::Event event;
    event.set_wall_time(now());
    if (step > 0) event.set_step(step);
    return event;
  }

  // Runs from start() to finish(): writes what is buffered every flush_secs, whether or not
  // anything was logged since. A failed write is reported by the next call.
  void flush_periodically() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
      // Until flush_secs after the last write (a log call may have written since).
      timer_wake_.wait_for(lock, std::chrono::duration<double>(std::max(0.01, flush_secs_ - (now() - last_flush_))));
      if (stopping_ || !timer_error_.empty() || now() - last_flush_ < flush_secs_) continue;
      try {
        writer_.flush();
        last_flush_ = now();
      } catch (const std::exception& e) {
        timer_error_ = e.what();
      }
    }
  }

  void stop_timer() {
    if (!timer_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    timer_wake_.notify_all();
    timer_.join();
  }

  void report_timer_error() {
    if (timer_error_.empty()) return;
    std::string message;
    message.swap(timer_error_);
    throw Error(HASTEN_ERR_SYSTEM, message);
  }

  void write(const tb::Event& event) {
    report_timer_error();
    if (!writer_.is_open()) throw Error(HASTEN_ERR_INVALID_USAGE, "tensorboard tracker: log before start");
    std::string bytes;
    if (!event.SerializeToString(&bytes))
      throw Error(HASTEN_ERR_INTERNAL, "tensorboard tracker: cannot serialize an event");
    writer_.append(bytes);
  }

  void write_plugin_event(const char* tag, const tb::HParamsPluginData& data) {
    tb::Event event;
    event.set_wall_time(now());
    auto* v = event.mutable_summary()->add_value();
    v->set_tag(tag);
    auto* plugin = v->mutable_metadata()->mutable_plugin_data();
    plugin->set_plugin_name("hparams");
    plugin->set_content(data.SerializeAsString());
    write(event);
  }

  void end_session(tb::SessionStatus status) {
    tb::HParamsPluginData data;
    data.mutable_session_end_info()->set_status(status);
    data.mutable_session_end_info()->set_end_time_secs(now());
    write_plugin_event("_hparams_/session_end_info", data);
  }

  void maybe_flush() {
    const double t = now();
    if (writer_.buffered_records() >= static_cast<size_t>(max_queue_) || t - last_flush_ >= flush_secs_) {
      writer_.flush();
      last_flush_ = t;
    }
  }

  double flush_secs_ = 0;  // kOptions' defaults: SummaryWriter's 120 s and 10 events
  int64_t max_queue_ = 0;
  std::string run_name_;
  std::string run_dir_, event_file_;
  double last_flush_ = 0;
  hasten::tensorboard::RecordWriter writer_;
  // The timer thread shares the writer with the tracker's calls.
  std::mutex mutex_;
  std::condition_variable timer_wake_;
  bool stopping_ = false;
  std::string timer_error_;
  std::thread timer_;
};


constexpr hasten_plugin_descriptor kTensorboard = hasten::sdk::with_options(
    hasten::sdk::tracker_descriptor<TensorboardTracker>(
        "tensorboard", "1.1", "TensorBoard event files: scalars, images, histograms, text, tables and the HPARAMS session of each run"),
    kOptions);

}  // namespace

HASTEN_PLUGIN_LIBRARY(&kTensorboard)
