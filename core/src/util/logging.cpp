#include <hasten/error.hpp>
#include <hasten/logging.hpp>
#include <hasten/process.hpp>

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <set>

namespace hasten {

namespace {

std::mutex g_mutex;
LogLevel g_level = LogLevel::info;
bool g_level_from_env_done = false;
std::map<std::string, std::shared_ptr<Logger>> g_loggers;
std::set<std::string> g_silent;  // loggers of non-main ranks that stay quiet

LogLevel parse_level(const std::string& level) {
  static const std::pair<const char*, LogLevel> names[] = {
      {"trace", LogLevel::trace}, {"debug", LogLevel::debug}, {"info", LogLevel::info},
      {"warn", LogLevel::warn},   {"warning", LogLevel::warn}, {"error", LogLevel::error},
      {"err", LogLevel::error},   {"off", LogLevel::off}};
  for (const auto& [name, l] : names)
    if (level == name) return l;
  throw ConfigError("log_level: '" + level + "' is not allowed (allowed: trace, debug, info, warn, error, off)");
}

void level_from_env_locked() {
  if (g_level_from_env_done) return;
  g_level_from_env_done = true;
  if (const char* v = std::getenv("HASTEN_LOG_LEVEL")) {
    try {
      g_level = parse_level(v);
    } catch (const ConfigError&) {  // resolve_config reports the bad value
    }
  }
}

// "[12:00:01.234] "
std::string timestamp() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::snprintf(buf, sizeof buf, "[%02d:%02d:%02d.%03d] ", tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  return buf;
}

// Standard error: one write(2) per line, so lines of several threads or ranks never interleave.
void write_stderr(LogLevel level, std::string_view head, std::string_view message) {
  static const bool colour = ::isatty(STDERR_FILENO) == 1;
  const char* on = "";
  if (colour) {
    switch (level) {
      case LogLevel::trace: on = "\033[37m"; break;
      case LogLevel::debug: on = "\033[36m"; break;
      case LogLevel::info: on = "\033[32m"; break;
      case LogLevel::warn: on = "\033[33m\033[1m"; break;
      default: on = "\033[31m\033[1m"; break;
    }
  }
  std::string line;
  line.reserve(head.size() + message.size() + 32);
  line.append(head).append("[").append(on).append(to_string(level)).append(colour ? "\033[m" : "").append("] ");
  line.append(message).push_back('\n');
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n < 0 && errno == EINTR) continue;  // a signal (the launcher's SIGCHLD) is not the end
    if (n <= 0) return;
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace

const char* to_string(LogLevel level) {
  switch (level) {
    case LogLevel::trace: return "trace";
    case LogLevel::debug: return "debug";
    case LogLevel::info: return "info";
    case LogLevel::warn: return "warning";
    case LogLevel::error: return "error";
    case LogLevel::off: return "off";
  }
  return "?";
}

void OstreamSink::write(LogLevel, std::string_view line) {
  std::lock_guard<std::mutex> lock(mutex_);
  out_ << line << '\n';
  out_.flush();
}

Logger::Logger(std::string name, std::string prefix, LogLevel level)
    : name_(std::move(name)), prefix_(std::move(prefix)), level_(level) {}

void Logger::add_sink(std::shared_ptr<LogSink> sink) {
  std::lock_guard<std::mutex> lock(mutex_);
  sinks_.push_back(std::move(sink));
}

void Logger::remove_sink(const std::shared_ptr<LogSink>& sink) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::erase(sinks_, sink);
}

void Logger::write(LogLevel level, std::string_view message) {
  if (!should_log(level)) return;
  const std::string head = timestamp() + prefix_;
  write_stderr(level, head, message);
  std::lock_guard<std::mutex> lock(mutex_);
  if (sinks_.empty()) return;
  const std::string line = head + "[" + to_string(level) + "] " + std::string(message);
  for (const auto& sink : sinks_)
    if (level >= sink->level()) sink->write(level, line);
}

std::shared_ptr<Logger> get_logger(const std::string& name, bool main_process_only) {
  std::lock_guard<std::mutex> lock(g_mutex);
  level_from_env_locked();
  const std::string key = name + (main_process_only ? "" : "#all");
  if (auto it = g_loggers.find(key); it != g_loggers.end()) return it->second;
  ProcessInfo info;
  try {
    info = detect_process_info(current_environment());
  } catch (const Error&) {  // reported where the run starts
  }
  // Under `hasten launch` with several workers the launcher prefixes every line with the rank.
  const char* prefixed = std::getenv("HASTEN_RANK_PREFIXED");
  const bool with_rank = info.world_size > 1 && !(prefixed != nullptr && std::string(prefixed) == "1");
  std::string prefix = with_rank ? "[rank " + std::to_string(info.rank) + "] [" + name + "] " : "[" + name + "] ";
  const bool silent = main_process_only && !info.is_main_process();
  auto logger = std::make_shared<Logger>(name, std::move(prefix), silent ? LogLevel::off : g_level);
  if (silent) g_silent.insert(key);
  g_loggers.emplace(key, logger);
  return logger;
}

void set_log_level(const std::string& level) {
  const LogLevel l = parse_level(level);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_level_from_env_done = true;
  g_level = l;
  for (auto& [key, logger] : g_loggers)
    if (g_silent.count(key) == 0) logger->set_level(l);
}

}  // namespace hasten
