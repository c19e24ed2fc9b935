#include <hasten/error.hpp>
#include <hasten/logging.hpp>
#include <hasten/process.hpp>

#include <spdlog/sinks/stdout_color_sinks.h>

#include <mutex>
#include <set>

namespace hasten {

namespace {

std::mutex g_mutex;
spdlog::level::level_enum g_level = spdlog::level::info;
bool g_level_from_env_done = false;
std::set<std::string> g_silent;  // loggers of non-main ranks that stay quiet

spdlog::level::level_enum parse_level(const std::string& level) {
  auto l = spdlog::level::from_str(level);
  if (l == spdlog::level::off && level != "off")
    throw ConfigError("log_level: '" + level +
                      "' is not allowed (allowed: trace, debug, info, warn, error, off)");
  return l;
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

}  // namespace

std::shared_ptr<spdlog::logger> get_logger(const std::string& name, bool main_process_only) {
  std::lock_guard<std::mutex> lock(g_mutex);
  level_from_env_locked();
  ProcessInfo info;
  try {
    info = detect_process_info(current_environment());
  } catch (const Error&) {  // reported where the run starts
  }
  const std::string key = name + (main_process_only ? "" : "#all");
  if (auto existing = spdlog::get(key)) return existing;
  auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>(key, sink);
  // Under `hasten launch` with several workers the launcher prefixes every line with the rank.
  const char* prefixed = std::getenv("HASTEN_RANK_PREFIXED");
  const bool with_rank = info.world_size > 1 && !(prefixed != nullptr && std::string(prefixed) == "1");
  std::string pattern = with_rank ? "[%H:%M:%S.%e] [rank " + std::to_string(info.rank) +
                                                  "] [" + name + "] [%^%l%$] %v"
                                            : "[%H:%M:%S.%e] [" + name + "] [%^%l%$] %v";
  logger->set_pattern(pattern);
  const bool silent = main_process_only && !info.is_main_process();
  logger->set_level(silent ? spdlog::level::off : g_level);
  if (silent) g_silent.insert(key);
  spdlog::register_logger(logger);
  return logger;
}

void set_log_level(const std::string& level) {
  auto l = parse_level(level);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_level_from_env_done = true;
  g_level = l;
  spdlog::apply_all([&](const std::shared_ptr<spdlog::logger>& logger) {
    if (g_silent.count(logger->name()) == 0) logger->set_level(l);
  });
}

}  // namespace hasten
