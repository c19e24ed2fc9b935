// Loading a plugin file in a throw-away child process first, with a time limit, so that a
// library whose constructor or entry function aborts, crashes or never returns is reported
// and skipped instead of taking the host down (or hanging it).
#pragma once

#include <functional>
#include <string>

namespace hasten::detail {

// The steps of a load, in order; the child reports each before it starts it, so that a
// crash can be named by where it happened.
enum class ProbeStage : char { Loading = 'L', Entry = 'E', Descriptors = 'D', Unloading = 'U', Done = 'K' };

struct ProbeOutcome {
  bool finished = false;   // the child reached Done: the file is safe to load in this process
  bool timed_out = false;  // killed after the time limit (not remembered: it may be load, not the file)
  std::string reason;      // why not, in words ("crashed with signal 11 (SIGSEGV) while ...")
};

// Runs `load(mark)` in a forked child whose stdio goes to /dev/null; `load` calls mark(stage)
// before each step. The child is killed after timeout_s.
ProbeOutcome probe_in_child(double timeout_s,
                            const std::function<void(const std::function<void(ProbeStage)>& mark)>& load);

// The probe time limit: HASTEN_PLUGIN_PROBE_TIMEOUT_S (seconds, 0.05 to 3600), default 10.
// Throws ConfigError naming the variable on a bad value.
double probe_timeout_s();

}  // namespace hasten::detail
