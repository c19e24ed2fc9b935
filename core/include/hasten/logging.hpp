// Logging. Loggers made here write on the main process only unless asked
// (main_process_only = false), and prefix the rank when the run has several processes.
//
// Messages are formatted with fmt, the copy LibTorch ships and itself uses (header-only), so
// a process holds one fmt: `logger->info("step {} loss {:.4f}", step, loss)`.
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace hasten {

enum class LogLevel : int { trace = 0, debug, info, warn, error, off };

// "trace", "debug", "info", "warning", "error", "off".
const char* to_string(LogLevel level);

// Where finished lines go. write() gets one line without its newline; a sink sees only lines
// at or above its own level.
class LogSink {
 public:
  virtual ~LogSink() = default;
  virtual void write(LogLevel level, std::string_view line) = 0;
  void set_level(LogLevel level) { level_ = level; }
  LogLevel level() const { return level_; }

 private:
  std::atomic<LogLevel> level_{LogLevel::trace};
};

// Lines into a std::ostream (a file, a std::ostringstream in a test), one at a time.
class OstreamSink final : public LogSink {
 public:
  explicit OstreamSink(std::ostream& out) : out_(out) {}
  void write(LogLevel level, std::string_view line) override;

 private:
  std::ostream& out_;
  std::mutex mutex_;
};

// A named logger: "[12:00:01.234] [rank 1] [hasten] [info] message". Thread-safe.
class Logger {
 public:
  Logger(std::string name, std::string prefix, LogLevel level);

  const std::string& name() const { return name_; }
  LogLevel level() const { return level_; }
  void set_level(LogLevel level) { level_ = level; }
  bool should_log(LogLevel level) const { return level != LogLevel::off && level >= level_.load(); }

  template <typename... Args>
  void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
    if (should_log(level)) write(level, fmt::format(format, std::forward<Args>(args)...));
  }
  template <typename... Args>
  void trace(fmt::format_string<Args...> format, Args&&... args) {
    log(LogLevel::trace, format, std::forward<Args>(args)...);
  }
  template <typename... Args>
  void debug(fmt::format_string<Args...> format, Args&&... args) {
    log(LogLevel::debug, format, std::forward<Args>(args)...);
  }
  template <typename... Args>
  void info(fmt::format_string<Args...> format, Args&&... args) {
    log(LogLevel::info, format, std::forward<Args>(args)...);
  }
  template <typename... Args>
  void warn(fmt::format_string<Args...> format, Args&&... args) {
    log(LogLevel::warn, format, std::forward<Args>(args)...);
  }
  template <typename... Args>
  void error(fmt::format_string<Args...> format, Args&&... args) {
    log(LogLevel::error, format, std::forward<Args>(args)...);
  }

  // Sinks besides the default one (standard error, coloured on a terminal).
  void add_sink(std::shared_ptr<LogSink> sink);
  void remove_sink(const std::shared_ptr<LogSink>& sink);

  // A message already formatted.
  void write(LogLevel level, std::string_view message);

 private:
  std::string name_;
  std::string prefix_;  // "[rank 1] [hasten] " or "[hasten] "
  std::atomic<LogLevel> level_;
  std::mutex mutex_;
  std::vector<std::shared_ptr<LogSink>> sinks_;
};

// A logger named `name` ("hasten" is the framework's own). Level from the config's
// log_level / HASTEN_LOG_LEVEL (default info).
std::shared_ptr<Logger> get_logger(const std::string& name = "hasten", bool main_process_only = true);

// Sets the level of every hasten logger: trace, debug, info, warn, error, off.
void set_log_level(const std::string& level);

}  // namespace hasten
