// Logging through spdlog. Loggers made here write on the main process only unless asked
// (main_process_only = false), and prefix the rank when the run has several processes.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <string>

namespace hasten {

// A logger named `name` ("hasten" is the framework's own). Level from the config's
// log_level / HASTEN_LOG_LEVEL (default info).
std::shared_ptr<spdlog::logger> get_logger(const std::string& name = "hasten",
                                           bool main_process_only = true);

// Sets the level of every hasten logger: trace, debug, info, warn, error, off.
void set_log_level(const std::string& level);

}  // namespace hasten
