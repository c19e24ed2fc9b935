#include "max_model.hpp"

#include <hasten/error.hpp>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>


namespace hasten::bench {

namespace {

// A trial is stopped, and the whole search ends, when the machine has less than this left:
// the budget is the processes', the machine's other users must not pay for it.
constexpr uint64_t kMachineReserve = 1ull << 30;

// The running trial, for the signal handler: its process group and its output file. A search
// stopped by SIGTERM, SIGINT or SIGHUP must not leave a trial behind holding gigabytes (its
// workers are in a group of their own, so the signal that stops the search never reaches them).
std::atomic<pid_t> g_trial_group{0};
char g_trial_output[64] = {};

extern "C" void stop_search(int signo) {
  // Only async-signal-safe calls here: kill the trial's whole group, remove its output file,
  // then die of the same signal so that whoever sent it sees it as the cause.
  const pid_t group = g_trial_group.load();
  if (group > 0) ::kill(-group, SIGKILL);
  if (g_trial_output[0] != 0) ::unlink(g_trial_output);
  ::signal(signo, SIG_DFL);
  ::raise(signo);
}

constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGHUP};

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = stop_search;
  sigemptyset(&sa.sa_mask);
  for (int s : kStopSignals) sigaddset(&sa.sa_mask, s);
  for (int s : kStopSignals) ::sigaction(s, &sa, nullptr);
}

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : kStopSignals) sigaddset(&set, s);
  return set;
}

uint64_t page_size() { return static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)); }

uint64_t mem_available() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (f >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib << 10;
  return ~0ull;
}

// Resident bytes of every process in process group pgid but its leader (the launcher of the
// trial, which holds no model): /proc/<pid>/stat names the group, statm the resident pages.
uint64_t group_rss(pid_t pgid) {
  uint64_t total = 0;
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    if (pid == pgid) continue;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    const auto paren = line.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream rest(line.substr(paren + 2));
    std::string state;
    long ppid = 0, pgrp = 0;
    if (!(rest >> state >> ppid >> pgrp) || pgrp != pgid) continue;
    std::ifstream statm(e.path() / "statm");
    uint64_t size = 0, resident = 0;
    if (statm >> size >> resident) total += resident * page_size();
  }
  return total;
}

struct Trial {
  int size = 0;
  bool fits = false;
  bool killed = false;     // stopped by the watch: over the budget while running
  std::string error;       // it failed for another reason (the search cannot go on)
  int64_t params = 0;
  double peak_mib = 0;     // the processes' peaks (ru_maxrss) summed, as they reported them
  double watched_mib = 0;  // the largest sum the watch saw
};

std::vector<std::string> trial_command(const MaxModelOptions& o, const std::string& side, int size) {
  if (side == "torch-ddp2") {
    const GptShape s = gpt_shape(size);
    return {o.python, o.peer, "--workload", "gpt-tiny", "--mode", "ddp2", "--warmup", "0", "--steps",
            std::to_string(kMaxModelSteps), "--batch", std::to_string(o.batch), "--gpt-shape", std::to_string(s.d_model),
            std::to_string(s.layers), std::to_string(o.seq)};
  }
  return {o.self, "--max-model-trial", side, "--max-model-size", std::to_string(size), "--max-model-seq",
          std::to_string(o.seq), "--max-model-batch", std::to_string(o.batch)};
}

// Starts the trial in a process group of its own and watches its memory every 20 ms: over
// the budget, or the machine short of memory, the whole group is killed at once.
Trial run_trial(const MaxModelOptions& o, const std::string& side, int size) {
  Trial t;
  t.size = size;
  char out_path[] = "/tmp/hasten-max-model-XXXXXX";
  const int out_fd = ::mkstemp(out_path);
  if (out_fd < 0) throw hasten::Error("--max-model: cannot create a temporary file in /tmp");
  const auto argv_s = trial_command(o, side, size);
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // The stop signals are held from before the fork until the handler knows the trial's group:
  // one arriving in between is delivered then, and still reaches the trial.
  const sigset_t stops = stop_signals();
  sigset_t before;
  ::sigprocmask(SIG_BLOCK, &stops, &before);
  std::snprintf(g_trial_output, sizeof g_trial_output, "%s", out_path);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::sigprocmask(SIG_SETMASK, &before, nullptr);
    throw hasten::Error("--max-model: fork failed");
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    for (int s : kStopSignals) ::signal(s, SIG_DFL);  // the trial dies of them; it is no searcher
    ::sigprocmask(SIG_SETMASK, &before, nullptr);
    ::dup2(out_fd, 1);
    const int null_fd = ::open("/dev/null", O_WRONLY);
    if (null_fd >= 0) ::dup2(null_fd, 2);  // a killed trial's complaints are expected
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // both sides set it: no window in which a worker escapes the group
  g_trial_group.store(pid);
  ::sigprocmask(SIG_SETMASK, &before, nullptr);
  ::close(out_fd);
  int status = 0;
  bool short_of_memory = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::hours(2);
  while (true) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    const uint64_t rss = group_rss(pid);
    t.watched_mib = std::max(t.watched_mib, rss / 1048576.0);
    short_of_memory = mem_available() < kMachineReserve;
    if (rss > o.budget_bytes || short_of_memory || std::chrono::steady_clock::now() > deadline) {
      t.killed = rss > o.budget_bytes;
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(-pid, SIGKILL);  // a rank still in teardown after its launcher ended
  g_trial_group.store(0);
  std::ifstream out(out_path);
  std::string line;
  nlohmann::json result;
  while (std::getline(out, line)) {
    const auto brace = line.find('{');
    if (brace == std::string::npos) continue;
    try {
      auto j = nlohmann::json::parse(line.substr(brace));
      if (j.contains("peak_rss_mb") && j.contains("params")) result = j;
    } catch (const nlohmann::json::exception&) {
    }
  }
  g_trial_output[0] = 0;
  std::filesystem::remove(out_path);
  if (short_of_memory) {
    t.error = "the machine has less than 1 GiB available: search stopped (lower --budget-mib)";
    return t;
  }
  if (t.killed) return t;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || result.is_null()) {
    // A worker that ran out of memory some other way (allocation failure) is a miss too.
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
      t.killed = true;
      return t;
    }
    t.error = side + " size " + std::to_string(size) + ": the trial failed (" +
              (WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status)) : "signal " + std::to_string(WTERMSIG(status))) +
              "): " + (argv_s.size() > 1 ? argv_s[0] + " " + argv_s[1] : argv_s[0]);
    return t;
  }
  t.params = result["params"].get<int64_t>();
  for (auto& r : result["peak_rss_mb"]) t.peak_mib += r.get<double>();
  t.fits = t.peak_mib * 1048576.0 <= static_cast<double>(o.budget_bytes);
  return t;
}

// The torch-ddp2 trials' interpreter as a path for execv: o.python, else $HASTEN_BENCH_PYTHON, else
// python3; a name without a slash is looked up on PATH. Empty when no executable is found.
std::string peer_python(const MaxModelOptions& o, std::string& named) {
  named = o.python;
  if (named.empty()) {
    const char* env = std::getenv("HASTEN_BENCH_PYTHON");
    named = env && *env ? env : "python3";
  }
  if (named.find('/') != std::string::npos) return ::access(named.c_str(), X_OK) == 0 ? named : std::string();
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path && *path ? path : "/bin:/usr/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + named;
    std::error_code ec;
    if (::access(candidate.c_str(), X_OK) == 0 && std::filesystem::is_regular_file(candidate, ec)) return candidate;
  }
  return {};
}

void print_trial(const std::string& side, const Trial& t, uint64_t budget) {
  std::cout << nlohmann::ordered_json{{"bench", "max_model_trial"}, {"side", side}, {"size", t.size},
                                      {"d_model", gpt_shape(t.size).d_model}, {"layers", gpt_shape(t.size).layers},
                                      {"params", t.params}, {"peak_rss_mib_sum", t.peak_mib},
                                      {"watched_rss_mib", t.watched_mib}, {"killed", t.killed},
                                      {"fits", t.fits}, {"budget_mib", budget / 1048576.0}}
                   .dump()
            << std::endl;
}

}  // namespace

GptShape gpt_shape(int size) {
  const int64_t s = size;
  return {32 * s, std::max<int64_t>(1, s / 2), s, 4 * 32 * s};
}

int max_model(const MaxModelOptions& options) {
  MaxModelOptions o = options;
  install_stop_handlers();
  std::map<std::string, Trial> best;
  for (const auto& side : o.sides) {
    if (side == "torch-ddp2" && !std::filesystem::exists(o.peer)) {
      std::cerr << "hasten-bench: error: --max-model: the PyTorch peer '" << o.peer << "' does not exist (--peer PATH)"
                << std::endl;
      return 2;
    }
    if (side == "torch-ddp2") {
      std::string named;
      o.python = peer_python(options, named);
      if (o.python.empty()) {
        std::cerr << "hasten-bench: error: --max-model: no Python interpreter '" << named
                  << "' for the torch-ddp2 side (set HASTEN_BENCH_PYTHON to the project's .venv/bin/python)" << std::endl;
        return 2;
      }
    }
    // Grow by doubling until a size does not fit, then bisect between the last that fitted and
    // the first that did not: every trial a fresh launch, each size tried once.
    std::map<int, Trial> tried;
    auto attempt = [&](int size) -> const Trial& {
      auto it = tried.find(size);
      if (it != tried.end()) return it->second;
      Trial t = run_trial(o, side, size);
      print_trial(side, t, o.budget_bytes);
      if (!t.error.empty()) throw hasten::Error("--max-model: " + t.error);
      return tried.emplace(size, t).first->second;
    };
    int lo = 0, hi = o.max_size + 1;  // lo fits (0: nothing yet), hi does not
    const int start = std::clamp(o.start_size, 1, o.max_size);
    if (attempt(start).fits) {
      lo = start;
      for (int size = std::min(start * 2, o.max_size); lo < o.max_size; size = std::min(size * 2, o.max_size)) {
        if (!attempt(size).fits) {
          hi = size;
          break;
        }
        lo = size;
      }
    } else {
      // A start above the answer: halve until a size fits (or size 1 does not).
      hi = start;
      for (int size = start / 2; size >= 1; size /= 2) {
        if (attempt(size).fits) {
          lo = size;
          break;
        }
        hi = size;
      }
    }
    while (hi - lo > 1) {
      const int mid = lo + (hi - lo) / 2;
      (attempt(mid).fits ? lo : hi) = mid;
    }
    Trial answer = lo > 0 ? tried.at(lo) : Trial{};
    best[side] = answer;
    std::cout << nlohmann::ordered_json{{"bench", "max_model"}, {"side", side}, {"budget_mib", o.budget_bytes / 1048576.0},
                                        {"size", lo}, {"d_model", lo > 0 ? gpt_shape(lo).d_model : 0},
                                        {"layers", lo > 0 ? gpt_shape(lo).layers : 0}, {"params", answer.params},
                                        {"peak_rss_mib_sum", answer.peak_mib},
                                        {"first_too_large", hi <= o.max_size ? nlohmann::json(hi) : nlohmann::json()},
                                        {"trials", tried.size()}}
                     .dump()
              << std::endl;
  }
  return 0;
}

}  // namespace hasten::bench
