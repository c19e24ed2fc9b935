// The local half of `hasten launch` (launcher.hpp): fork/exec of the workers, their output
// prefixed and logged, and signal forwarding. The stop-the-others policy is the supervisor's
// (hasten/detail/worker_supervisor.hpp), shared with hasten::launch.
#include "launcher.hpp"

#include <hasten/detail/launch_contract.hpp>
#include <hasten/detail/worker_supervisor.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

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
  int rank = 0;
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
  if (!run_token.empty()) env.emplace_back(detail::kRunTokenVariable, run_token);
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
  // Each worker leads its own process group, so that signals reach its children too. The
  // supervisor kills what still runs on every way out of this function.
  detail::WorkerSupervisor supervisor(plan.grace_s, /*process_groups=*/true);
  for (int lr = 0; lr < plan.local_world_size; ++lr) {
    Worker& w = workers[static_cast<size_t>(lr)];
    w.rank = plan.global_rank(lr);
    if (!plan.log_dir.empty()) {
      // Not through a link planted at the name (a shared log directory): opened O_NOFOLLOW,
      // then the stream opens that very file through its descriptor.
      const std::string path = plan.log_dir + "/rank_" + std::to_string(w.rank) + ".log";
      const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
      if (fd < 0) {
        std::cerr << "hasten: error: cannot write '" << path << "': " << std::strerror(errno)
                  << (errno == ELOOP ? " (a symbolic link: remove it)" : "") << std::endl;
        return 1;
      }
      w.log = std::make_unique<std::ofstream>("/proc/self/fd/" + std::to_string(fd));
      ::close(fd);
      if (!w.log->is_open()) {
        std::cerr << "hasten: error: cannot write '" << path << "' (reopening it through /proc/self/fd failed)" << std::endl;
        return 1;
      }
    }
    int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
    auto close_pipes = [&] {
      for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]})
        if (fd >= 0) ::close(fd);
    };
    if (use_pipes && (::pipe(out_pipe) != 0 || ::pipe(err_pipe) != 0)) {
      std::cerr << "hasten: error: pipe: " << std::strerror(errno) << std::endl;
      close_pipes();
      return 1;
    }
    // Everything the child needs is prepared before fork (no allocation after it).
    // The child's whole environment is built here: putenv after fork could allocate while
    // another thread of the launcher (the machine agents') holds the allocator's lock.
    std::vector<std::string> env_strings;
    const auto extra = plan.worker_env(lr);
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      const std::string key = entry.substr(0, entry.find('='));
      bool replaced = false;
      for (auto& kv : extra) replaced = replaced || kv.first == key;
      if (!replaced) env_strings.push_back(entry);
    }
    // Later entries of the plan win over earlier ones with the same name.
    for (size_t i = 0; i < extra.size(); ++i) {
      bool later = false;
      for (size_t j = i + 1; j < extra.size(); ++j) later = later || extra[j].first == extra[i].first;
      if (!later) env_strings.push_back(extra[i].first + "=" + extra[i].second);
    }
    std::vector<char*> envp;
    for (auto& kv : env_strings) envp.push_back(const_cast<char*>(kv.c_str()));
    envp.push_back(nullptr);
    std::vector<char*> argv;
    for (auto& a : plan.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const pid_t launcher_pid = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::cerr << "hasten: error: fork: " << std::strerror(errno) << std::endl;
      close_pipes();
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
      ::execvpe(argv[0], argv.data(), envp.data());
      const std::string msg = "hasten launch: cannot run '" + plan.command[0] + "': " + std::strerror(errno) + "\n";
      write_all(2, msg);
      ::_exit(127);
    }
    ::setpgid(pid, pid);
    supervisor.add(w.rank, pid);
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

  int forwarded_signal = 0;
  for (;;) {
    if (g_signal != 0) {
      const int sig = g_signal;
      g_signal = 0;
      forwarded_signal = sig;
      supervisor.stop(sig);
    }
    // Asked on every pass, also while stopping: across machines it is also this launcher's
    // heartbeat to machine 0's coordinator (machine_agents.hpp), which a long grace must not mute.
    if (plan.stop_requested && plan.stop_requested() && !supervisor.stopping()) supervisor.stop(SIGTERM);
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
    for (const auto& end : supervisor.collect()) {
      if (!end.stopped_the_run) continue;
      const std::string what = detail::describe_worker_exit(end.rank, end.pid, end.status);
      if (plan.on_failure) plan.on_failure(end.rank, what);
      // With one worker its own output says what happened.
      if (plan.world_size > 1 && plan.echo) std::cerr << "hasten launch: " << what << "; stopping the other workers" << std::endl;
    }
    if (!supervisor.any_running()) break;
    supervisor.enforce_grace();
  }
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
  const int first_failure = supervisor.first_failure();
  if (failed_rank != nullptr) *failed_rank = first_failure >= 0 ? supervisor.rank(static_cast<size_t>(first_failure)) : -1;
  if (first_failure >= 0) return detail::exit_code_of(supervisor.status(static_cast<size_t>(first_failure)));
  for (size_t i = 0; i < supervisor.size(); ++i)
    if (!(WIFEXITED(supervisor.status(i)) && WEXITSTATUS(supervisor.status(i)) == 0))
      return detail::exit_code_of(supervisor.status(i));
  return forwarded_signal != 0 ? 128 + forwarded_signal : 0;
}

}  // namespace hasten::cli
