// The probe child. Why fork without exec: a torch-tier plugin links LibTorch, and an exec'd
// helper would map and relocate LibTorch again for every file (seconds each on a first start);
// a forked child already has it. Forking a process that may have other threads (LibTorch's
// pools) is safe here because the child does only what glibc makes safe after fork: malloc and
// the dynamic loader's locks are reset in the child of a multi-threaded fork (glibc >= 2.24),
// and the child does nothing but dlopen, dlsym, call the entry, read the descriptors, dlclose, write
// one byte per step to a pipe and _exit. It never returns into the caller, never runs atexit
// handlers or static destructors (_exit), and stdio buffers are flushed before the fork so
// nothing is written twice. Should a lock held by another parent thread still block the child
// (a plugin constructor that takes one), the time limit ends it; a timed-out probe is reported
// but not remembered (see ProbeOutcome), so the next start tries again.
#include "plugins/plugin_probe.hpp"

#include <hasten/error.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>

namespace hasten::detail {

namespace {

const char* stage_words(char stage) {
  switch (stage) {
    case 'L': return "while being loaded (its constructors or the dynamic loader)";
    case 'E': return "while running its entry function hasten_plugin_entry_v1";
    case 'D': return "while its descriptors were read (a bad descriptor)";
    case 'U': return "while being unloaded (its destructors)";
    case 'K': return "after loading";
  }
  return "before loading";
}

std::string signal_words(int sig) {
  std::string out = "signal " + std::to_string(sig);
  if (const char* abbrev = ::sigabbrev_np(sig)) out += std::string(" (SIG") + abbrev + ")";
  return out;
}

std::string seconds_words(double s) {
  std::ostringstream o;
  o << s;
  return o.str() + " s";
}

// The child: default crash signals, no core files, dies with its parent, stdio to /dev/null.
[[noreturn]] void run_child(int fd, const std::function<void(const std::function<void(ProbeStage)>&)>& load) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGILL, SIGFPE, SIGTRAP, SIGSYS, SIGPIPE, SIGTERM, SIGINT})
    ::signal(sig, SIG_DFL);
  sigset_t all;
  sigemptyset(&all);
  ::sigprocmask(SIG_SETMASK, &all, nullptr);
  struct rlimit no_core {0, 0};
  ::setrlimit(RLIMIT_CORE, &no_core);
  const int null = ::open("/dev/null", O_RDWR);
  if (null >= 0) {
    ::dup2(null, STDIN_FILENO);
    ::dup2(null, STDOUT_FILENO);
    ::dup2(null, STDERR_FILENO);
  }
  auto mark = [fd](ProbeStage stage) {
    const char c = static_cast<char>(stage);
    while (::write(fd, &c, 1) < 0 && errno == EINTR) {
    }
  };
  try {
    load(mark);
  } catch (...) {  // load() reports instead of throwing; a throw is still not a crash
  }
  mark(ProbeStage::Done);
  ::_exit(0);
}

}  // namespace

double probe_timeout_s() {
  const char* v = std::getenv("HASTEN_PLUGIN_PROBE_TIMEOUT_S");
  if (v == nullptr || *v == '\0') return 10.0;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  if (end == v || *end != '\0' || !std::isfinite(s) || s < 0.05 || s > 3600)
    throw ConfigError(std::string("HASTEN_PLUGIN_PROBE_TIMEOUT_S='") + v +
                      "' is not a probe time limit (allowed: seconds from 0.05 to 3600)");
  return s;
}

ProbeOutcome probe_in_child(double timeout_s,
                            const std::function<void(const std::function<void(ProbeStage)>& mark)>& load) {
  ProbeOutcome out;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    out.reason = std::string("could not be probed (pipe: ") + std::strerror(errno) + ")";
    return out;
  }
  std::fflush(nullptr);
  std::cout.flush();
  std::cerr.flush();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    out.reason = std::string("could not be probed (fork: ") + std::strerror(errno) + ")";
    return out;
  }
  if (pid == 0) {
    ::close(fds[0]);
    run_child(fds[1], load);
  }
  ::close(fds[1]);

  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(timeout_s));
  auto left_ms = [&] {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
    return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(left, 1 << 30)));
  };
  char stage = 0;
  bool eof = false;
  while (!eof) {
    pollfd p{fds[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, left_ms());
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;  // the time is up
    char buf[64];
    const ssize_t n = ::read(fds[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      eof = true;
      break;
    }
    stage = buf[n - 1];
  }
  ::close(fds[0]);
  // The pipe closes when the child exits (or closes it itself): wait for the status within
  // what is left of the time limit, then kill.
  int status = 0;
  pid_t done = 0;
  while (true) {
    done = ::waitpid(pid, &status, WNOHANG);
    if (done != 0 || left_ms() == 0) break;
    ::usleep(1000);
  }
  if (done == 0) {
    ::kill(pid, SIGKILL);
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    out.timed_out = true;
    out.reason = "timed out after " + seconds_words(timeout_s) + " " + stage_words(stage) + " (killed)";
    return out;
  }
  if (done < 0) {  // someone else reaped it (a SIGCHLD handler): only the pipe can tell
    out.finished = stage == 'K';
    if (!out.finished) out.reason = std::string("probe process ended ") + stage_words(stage);
    return out;
  }
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    out.reason = (sig == SIGABRT ? "aborted with " : "crashed with ") + signal_words(sig) + " " + stage_words(stage);
    return out;
  }
  if (stage != 'K') {
    out.reason = "exited with status " + std::to_string(WEXITSTATUS(status)) + " " + stage_words(stage);
    return out;
  }
  out.finished = true;
  return out;
}

}  // namespace hasten::detail
