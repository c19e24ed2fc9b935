// Stopping on a scheduler's signal: SLURM's scancel and preemption send SIGTERM (and, with
// `--signal=USR1@T`, SIGUSR1 some time before the end) and SIGKILL after KillWait. A loop that
// asks acc.stop_requested() each step can save a final checkpoint and return in that window.
//
// The handlers are installed by the first call, not by the Accelerator: a program that never
// asks keeps the default action (SIGTERM ends it), so a launcher's SIGTERM still stops it. A
// second signal of the same kind takes the default action: a stuck save does not make the
// process unkillable. A program that set its own handler (or SIG_IGN) keeps it.
#include <hasten/logging.hpp>

#include <signal.h>

#include <atomic>
#include <mutex>

#include "engine/engine_state.hpp"

namespace hasten::detail {

namespace {

// The stop signals received so far, one bit each. Lock-free (a signal handler may run on any
// thread while the training thread reads it).
std::atomic<int> g_received{0};
static_assert(std::atomic<int>::is_always_lock_free, "a signal handler needs a lock-free flag");

int bit_of(int sig) { return sig == SIGTERM ? 1 : 2; }

extern "C" void on_stop_signal(int sig) {
  if (g_received.fetch_or(bit_of(sig)) & bit_of(sig)) {  // the second of this kind: its default action, now
    ::signal(sig, SIG_DFL);
    ::raise(sig);
  }
}

void arm_stop_signals() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;  // interrupted reads and waits resume
    for (int sig : {SIGTERM, SIGUSR1}) {
      struct sigaction previous {};
      ::sigaction(sig, nullptr, &previous);
      // A program that ignores the signal, or handles it itself, keeps its own way, and hears so.
      if (previous.sa_handler == SIG_DFL && !(previous.sa_flags & SA_SIGINFO))
        ::sigaction(sig, &action, nullptr);
      else
        get_logger()->warn("stop_requested: this program already {} {}; hasten leaves it, and stop_requested() does "
                           "not see that signal",
                           previous.sa_handler == SIG_IGN ? "ignores" : "handles", sig == SIGTERM ? "SIGTERM" : "SIGUSR1");
    }
  });
}

}  // namespace

bool Engine::stop_requested() {
  arm_stop_signals();
  const bool mine = g_received.load() != 0;
  if (impl_->process.world_size == 1) return mine;
  // Every rank stops at the same step: a signal that reached one rank (or arrived between two
  // ranks' checks) is every rank's at this check or the next.
  torch::Tensor flag = torch::tensor({mine ? int64_t{1} : int64_t{0}});
  return reduce(flag, "sum").item<int64_t>() > 0;
}

}  // namespace hasten::detail
