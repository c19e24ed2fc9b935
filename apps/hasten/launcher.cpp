// The local half of `hasten launch` (launcher.hpp): fork/exec of the workers, their output
// prefixed and logged, signal forwarding and the stop-the-others policy.
#include "launcher.hpp"

#include <hasten/detail/launch_contract.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <atomic>
#include <memory>
#include <thread>

namespace hasten::cli {

namespace {

volatile sig_atomic_t g_signal = 0;

void on_signal(int sig) { g_signal = sig; }

// Output of one worker stream, split into lines, prefixed and copied to the log.
struct Stream {
  int fd = -1;
  int out_fd = 1;  // our stdout or stderr
  std::string pending;
};

struct Worker {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  // Set by the worker's waiter thread the moment the process ends, so that when several end
  // in one polling round the first to fail is the one named (a peer that notices the death
  // and exits a moment later is not the cause).
  std::atomic<bool> exited{false};
  std::atomic<int> exit_status{0};
  std::chrono::steady_clock::time_point exit_time;
  std::thread waiter;
  Stream out, err;
  std::unique_ptr<std::ofstream> log;
};

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    done += static_cast<size_t>(n);
  }
}

void emit(Worker& w, Stream& s, const std::string& prefix, bool flush_partial, bool echo) {
  if (flush_partial && !s.pending.empty() && s.pending.back() != '\n') s.pending += '\n';
  std::string out, plain;
  size_t start = 0;
  for (size_t nl; (nl = s.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    const std::string line = s.pending.substr(start, nl - start + 1);
    plain += line;  // the log holds the worker's own text
    out += prefix + line;
  }
  s.pending.erase(0, start);
  if (out.empty()) return;
  if (w.log) {
    *w.log << plain;
    w.log->flush();
  }
  if (echo) write_all(s.out_fd, out);
}

// Reads what is available; returns false at EOF.
bool drain(Worker& w, Stream& s, const std::string& prefix, bool echo) {
  if (s.fd < 0) return false;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(s.fd, buf, sizeof buf);
    if (n > 0) {
      s.pending.append(buf, static_cast<size_t>(n));
      emit(w, s, prefix, false, echo);
      continue;
    }
    if (n == 0) {
      emit(w, s, prefix, true, echo);
      ::close(s.fd);
      s.fd = -1;
      return false;
    }
    if (errno == EINTR) continue;
    return true;  // EAGAIN: nothing more for now
  }
}

void signal_all(std::vector<Worker>& workers, int sig) {
  for (auto& w : workers)
    if (w.running) ::kill(-w.pid, sig);  // the worker's whole process group
}

}  // namespace

std::vector<std::pair<std::string, std::string>> LaunchPlan::worker_env(int local_rank) const {
  detail::WorkerPlace place;
  place.rank = global_rank(local_rank);
  place.local_rank = local_rank;
  place.world_size = world_size;
  place.local_world_size = local_world_size;
  place.group_rank = machine_rank;
  place.master_addr = master_addr;
  place.master_port = master_port;
  // The contract comes after the plan's own variables, so it wins where both set one.
  auto env = this->env;
  for (auto& kv : detail::torchrun_env(place)) env.push_back(std::move(kv));
  env.emplace_back("HASTEN_LAUNCHED", "1");
  // The launcher starts every line with "[rank r] ": the workers' log lines leave it out.
  if (prefix_output) env.emplace_back("HASTEN_RANK_PREFIXED", "1");
  return env;
}

int run_workers(const LaunchPlan& plan, bool* interrupted, int* failed_rank) {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGHUP, &sa, nullptr);

  if (!plan.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(plan.log_dir, ec);
    if (ec) {
      std::cerr << "hasten: error: cannot create log_dir '" << plan.log_dir << "': " << ec.message() << std::endl;
      return 1;
    }
  }
  const bool use_pipes = plan.prefix_output || !plan.log_dir.empty();

  std::vector<Worker> workers(static_cast<size_t>(plan.local_world_size));
  // Every exit from here kills what still runs and joins the waiter threads.
  struct Reaper {
    std::vector<Worker>& workers;
    ~Reaper() {
      for (auto& w : workers)
        if (w.waiter.joinable()) {
          if (!w.exited.load()) ::kill(-w.pid, SIGKILL);
          w.waiter.join();
        }
    }
  } reaper{workers};
  for (int lr = 0; lr < plan.local_world_size; ++lr) {
    Worker& w = workers[static_cast<size_t>(lr)];
    w.local_rank = lr;
    w.rank = plan.global_rank(lr);
    if (!plan.log_dir.empty()) {
      w.log = std::make_unique<std::ofstream>(plan.log_dir + "/rank_" + std::to_string(w.rank) + ".log");
    }
    int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
    if (use_pipes && (::pipe(out_pipe) != 0 || ::pipe(err_pipe) != 0)) {
      std::cerr << "hasten: error: pipe: " << std::strerror(errno) << std::endl;
      signal_all(workers, SIGKILL);
      return 1;
    }
    // Everything the child needs is prepared before fork (no allocation after it).
    std::vector<std::string> env_strings;
    for (auto& [k, v] : plan.worker_env(lr)) env_strings.push_back(k + "=" + v);
    std::vector<char*> argv;
    for (auto& a : plan.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const pid_t launcher_pid = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::cerr << "hasten: error: fork: " << std::strerror(errno) << std::endl;
      signal_all(workers, SIGKILL);
      return 1;
    }
    if (pid == 0) {
      ::setpgid(0, 0);
      // A launcher killed with SIGKILL cannot stop its workers: the kernel does it for us
      // (the setting survives exec). It fires when the forking thread ends, and this one is
      // the launcher's main thread, which lives as long as the launcher. If the launcher died
      // between fork and prctl, we were already reparented and nothing would ever fire.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher_pid) ::_exit(128 + SIGKILL);
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      ::sigaction(SIGINT, &dfl, nullptr);
      ::sigaction(SIGTERM, &dfl, nullptr);
      ::sigaction(SIGHUP, &dfl, nullptr);
      if (use_pipes) {
        ::dup2(out_pipe[1], 1);
        ::dup2(err_pipe[1], 2);
        ::close(out_pipe[0]);
        ::close(out_pipe[1]);
        ::close(err_pipe[0]);
        ::close(err_pipe[1]);
      }
      for (auto& kv : env_strings) ::putenv(const_cast<char*>(kv.c_str()));
      ::execvp(argv[0], argv.data());
      const std::string msg = "hasten launch: cannot run '" + plan.command[0] + "': " + std::strerror(errno) + "\n";
      write_all(2, msg);
      ::_exit(127);
    }
    ::setpgid(pid, pid);
    w.pid = pid;
    w.running = true;
    w.waiter = std::thread([&w] {
      int st = 0;
      while (::waitpid(w.pid, &st, 0) < 0 && errno == EINTR) {
      }
      w.exit_time = std::chrono::steady_clock::now();
      w.exit_status.store(st);
      w.exited.store(true);
    });
    if (use_pipes) {
      ::close(out_pipe[1]);
      ::close(err_pipe[1]);
      w.out.fd = out_pipe[0];
      w.out.out_fd = 1;
      w.err.fd = err_pipe[0];
      w.err.out_fd = 2;
      ::fcntl(w.out.fd, F_SETFL, O_NONBLOCK);
      ::fcntl(w.err.fd, F_SETFL, O_NONBLOCK);
    }
  }

  using clock = std::chrono::steady_clock;
  int first_failure = -1;  // index of the worker whose failure stops the run
  int forwarded_signal = 0;
  bool stopping = false;
  clock::time_point kill_deadline{};
  auto begin_stop = [&] {
    if (stopping) return;
    stopping = true;
    kill_deadline = clock::now() + std::chrono::milliseconds(static_cast<int64_t>(plan.grace_s * 1000));
  };

  for (;;) {
    if (g_signal != 0) {
      const int sig = g_signal;
      g_signal = 0;
      forwarded_signal = sig;
      signal_all(workers, sig);
      begin_stop();
    }
    // Output.
    std::vector<pollfd> fds;
    std::vector<std::pair<Worker*, Stream*>> owners;
    for (auto& w : workers)
      for (Stream* s : {&w.out, &w.err})
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          owners.emplace_back(&w, s);
        }
    if (!fds.empty()) {
      ::poll(fds.data(), fds.size(), 50);
      for (size_t i = 0; i < fds.size(); ++i)
        if (fds[i].revents != 0) {
          Worker* w = owners[i].first;
          drain(*w, *owners[i].second,
                plan.prefix_output ? "[rank " + std::to_string(w->rank) + "] " : "", plan.echo);
        }
    } else {
      ::usleep(50 * 1000);
    }
    // Exits, in the order they happened.
    std::vector<size_t> ended;
    for (size_t i = 0; i < workers.size(); ++i)
      if (workers[i].running && workers[i].exited.load()) ended.push_back(i);
    std::sort(ended.begin(), ended.end(), [&](size_t a, size_t b) { return workers[a].exit_time < workers[b].exit_time; });
    for (size_t i : ended) {
      Worker& w = workers[i];
      w.running = false;
      w.status = w.exit_status.load();
      const int status = w.status;
      const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (failed && first_failure < 0 && !stopping) {
        first_failure = static_cast<int>(i);
        if (plan.world_size > 1 && plan.echo)  // with one worker its own output says what happened
          std::cerr << "hasten launch: " << detail::describe_worker_exit(w.rank, w.pid, status)
                    << "; stopping the other workers" << std::endl;
        signal_all(workers, SIGTERM);
        begin_stop();
      }
      ::kill(-w.pid, SIGKILL);  // its descendants go with it
    }
    bool any_running = false;
    for (auto& w : workers) any_running = any_running || w.running;
    if (!any_running) break;
    if (stopping && clock::now() > kill_deadline) signal_all(workers, SIGKILL);
  }
  for (auto& w : workers)
    if (w.waiter.joinable()) w.waiter.join();
  // What is left in the pipes.
  for (auto& w : workers)
    for (Stream* s : {&w.out, &w.err})
      while (s->fd >= 0 && drain(w, *s, plan.prefix_output ? "[rank " + std::to_string(w.rank) + "] " : "", plan.echo)) {
        if (s->fd >= 0) {
          pollfd p{s->fd, POLLIN, 0};
          if (::poll(&p, 1, 100) <= 0) {
            ::close(s->fd);
            s->fd = -1;
          }
        }
      }
  if (interrupted != nullptr) *interrupted = forwarded_signal != 0;
  if (failed_rank != nullptr) *failed_rank = first_failure >= 0 ? workers[static_cast<size_t>(first_failure)].rank : -1;
  if (first_failure >= 0) return detail::exit_code_of(workers[static_cast<size_t>(first_failure)].status);
  if (forwarded_signal != 0) {
    for (auto& w : workers)
      if (!(WIFEXITED(w.status) && WEXITSTATUS(w.status) == 0)) return detail::exit_code_of(w.status);
    return 128 + forwarded_signal;
  }
  for (auto& w : workers)
    if (!(WIFEXITED(w.status) && WEXITSTATUS(w.status) == 0)) return detail::exit_code_of(w.status);
  return 0;
}

}  // namespace hasten::cli
