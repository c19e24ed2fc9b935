// The launchers' shared supervision loop (hasten/detail/worker_supervisor.hpp).
#include <hasten/detail/worker_supervisor.hpp>

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <thread>

namespace hasten::detail {

namespace {

struct Worker {
  int rank = 0;
  pid_t pid = -1;
  bool running = true;  // until collect() has reported its end
  int status = 0;
  // Set by the worker's waiter thread the moment the process ends, so that when several end
  // between two collect() calls the first to fail is the one named (a peer that notices the
  // death and exits a moment later is not the cause).
  std::atomic<bool> exited{false};
  std::atomic<int> exit_status{0};
  std::chrono::steady_clock::time_point exit_time;
  std::thread waiter;
};

bool failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

}  // namespace

struct WorkerSupervisor::Impl {
  double grace_s = 5;
  bool process_groups = false;
  std::vector<std::unique_ptr<Worker>> workers;
  bool waiters_started = false;
  bool stopping = false;
  int first_failure = -1;
  std::chrono::steady_clock::time_point kill_at{};

  void signal(Worker& w, int sig) const {
    if (w.exited.load()) return;  // its pid may already be reused once reaped
    ::kill(process_groups ? -w.pid : w.pid, sig);
  }

  // Waiters start at the first collect(), after the launcher has forked every worker: a
  // fork while this process starts threads would copy it in the middle of that.
  void start_waiters() {
    if (waiters_started) return;
    waiters_started = true;
    for (auto& wp : workers) {
      Worker* w = wp.get();
      w->waiter = std::thread([w] {
        int st = 0;
        while (::waitpid(w->pid, &st, 0) < 0 && errno == EINTR) {
        }
        w->exit_time = std::chrono::steady_clock::now();
        w->exit_status.store(st);
        w->exited.store(true);
      });
    }
  }
};

WorkerSupervisor::WorkerSupervisor(double grace_s, bool process_groups) : impl_(std::make_unique<Impl>()) {
  impl_->grace_s = grace_s;
  impl_->process_groups = process_groups;
}

WorkerSupervisor::~WorkerSupervisor() {
  for (auto& w : impl_->workers) {
    if (w->running) impl_->signal(*w, SIGKILL);
    if (w->waiter.joinable()) {
      w->waiter.join();
    } else if (!w->exited.load()) {  // never collected: reap it here
      int st = 0;
      while (::waitpid(w->pid, &st, 0) < 0 && errno == EINTR) {
      }
    }
  }
}

void WorkerSupervisor::add(int rank, pid_t pid) {
  auto w = std::make_unique<Worker>();
  w->rank = rank;
  w->pid = pid;
  impl_->workers.push_back(std::move(w));
}

std::vector<WorkerSupervisor::End> WorkerSupervisor::collect() {
  impl_->start_waiters();
  std::vector<size_t> ended;
  for (size_t i = 0; i < impl_->workers.size(); ++i)
    if (impl_->workers[i]->running && impl_->workers[i]->exited.load()) ended.push_back(i);
  std::sort(ended.begin(), ended.end(),
            [&](size_t a, size_t b) { return impl_->workers[a]->exit_time < impl_->workers[b]->exit_time; });
  std::vector<End> ends;
  for (size_t i : ended) {
    Worker& w = *impl_->workers[i];
    w.running = false;
    w.status = w.exit_status.load();
    w.waiter.join();
    End end;
    end.index = i;
    end.rank = w.rank;
    end.pid = w.pid;
    end.status = w.status;
    if (failed(w.status) && impl_->first_failure < 0 && !impl_->stopping) {
      impl_->first_failure = static_cast<int>(i);
      end.stopped_the_run = true;
      stop(SIGTERM);
    }
    // Its descendants go with it. The group outlives its leader's reaping, so this is safe.
    if (impl_->process_groups) ::kill(-w.pid, SIGKILL);
    ends.push_back(end);
  }
  return ends;
}

void WorkerSupervisor::stop(int sig) {
  for (auto& w : impl_->workers)
    if (w->running) impl_->signal(*w, sig);
  if (impl_->stopping) return;
  impl_->stopping = true;
  impl_->kill_at = std::chrono::steady_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(impl_->grace_s * 1000));
}

void WorkerSupervisor::enforce_grace() {
  if (!impl_->stopping || std::chrono::steady_clock::now() <= impl_->kill_at) return;
  for (auto& w : impl_->workers)
    if (w->running) impl_->signal(*w, SIGKILL);
}

bool WorkerSupervisor::any_running() const {
  return std::any_of(impl_->workers.begin(), impl_->workers.end(), [](const auto& w) { return w->running; });
}
bool WorkerSupervisor::stopping() const { return impl_->stopping; }
int WorkerSupervisor::first_failure() const { return impl_->first_failure; }
int WorkerSupervisor::status(size_t index) const { return impl_->workers.at(index)->status; }
int WorkerSupervisor::rank(size_t index) const { return impl_->workers.at(index)->rank; }
pid_t WorkerSupervisor::pid(size_t index) const { return impl_->workers.at(index)->pid; }
size_t WorkerSupervisor::size() const { return impl_->workers.size(); }

}  // namespace hasten::detail
