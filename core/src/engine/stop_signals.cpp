// Stopping on a scheduler's signal: SLURM's scancel and preemption send SIGTERM (and, with
// `--signal=USR1@T`, SIGUSR1 some time before the end) and SIGKILL after KillWait. A loop that
// asks acc.stop_requested() each step can save a final checkpoint and return in that window.
//
// The handlers are installed by the first call, not by the Accelerator: a program that never
// asks keeps the default action (SIGTERM ends it), so a launcher's SIGTERM still stops it. A
// second signal of the same kind restores the default and re-raises it: a stuck save does not
// make the process unkillable.
#include <signal.h>

#include <mutex>

#include "engine/engine_state.hpp"

namespace hasten::detail {

namespace {

volatile sig_atomic_t g_stop_signal = 0;  // the first stop signal received (0: none)

extern "C" void on_stop_signal(int sig) {
  if (g_stop_signal != 0) {  // the second: the default action, now
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  g_stop_signal = sig;
}

void arm_stop_signals() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;  // interrupted reads and waits resume
    for (int sig : {SIGTERM, SIGUSR1}) ::sigaction(sig, &action, nullptr);
  });
}

}  // namespace

bool Engine::stop_requested() {
  arm_stop_signals();
  const bool mine = g_stop_signal != 0;
  if (impl_->process.world_size == 1) return mine;
  // Every rank stops at the same step: a signal that reached one rank (or arrived between two
  // ranks' checks) is every rank's at this check or the next.
  torch::Tensor flag = torch::tensor({mine ? int64_t{1} : int64_t{0}});
  return reduce(flag, "sum").item<int64_t>() > 0;
}

}  // namespace hasten::detail
