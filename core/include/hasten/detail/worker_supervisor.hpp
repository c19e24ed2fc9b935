// The supervision loop both launchers share (hasten::launch in core/src/launch/launch.cpp and
// `hasten launch` in apps/hasten/launcher.cpp): it notes each worker's end the moment it
// happens and applies the one stop policy. The first worker to fail, a deadline or a signal
// to the launcher stops the run: every worker still running gets SIGTERM (or the signal), and
// SIGKILL once the grace period is over. The launchers differ only in how they start workers
// (fork of a function; exec of a program with piped output) and in what they say.
//
//   WorkerSupervisor sup(grace_s, /*process_groups=*/true);
//   sup.add(rank, pid);                      // for every worker started
//   while (sup.any_running()) {
//     ... the launcher's own work (output, signals: sup.stop(sig)) ...
//     for (auto& end : sup.collect()) ...;   // ends in the order they happened
//     sup.enforce_grace();
//   }
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <vector>

namespace hasten::detail {

class WorkerSupervisor {
 public:
  // process_groups: each worker leads its own process group (the launcher called setpgid),
  // so that signals and the final SIGKILL reach the worker's own children too.
  WorkerSupervisor(double grace_s, bool process_groups);
  // Kills (SIGKILL) every worker still running and waits for it: no worker outlives its
  // supervisor, whatever path the launcher leaves by.
  ~WorkerSupervisor();
  WorkerSupervisor(const WorkerSupervisor&) = delete;
  WorkerSupervisor& operator=(const WorkerSupervisor&) = delete;

  void add(int rank, pid_t pid);

  struct End {
    size_t index = 0;            // order of add()
    int rank = 0;
    pid_t pid = -1;
    int status = 0;              // waitpid status
    bool stopped_the_run = false;  // the first failure, which sent SIGTERM to the others
  };
  // The workers that ended since the last call, in the order they ended. The first failure
  // seen before any stop starts the stop of the others.
  std::vector<End> collect();

  // Sends sig to every running worker and starts the grace period (once; a later stop only
  // forwards its signal).
  void stop(int sig);
  // SIGKILL to every running worker once the grace period of a stop is over.
  void enforce_grace();

  bool any_running() const;
  bool stopping() const;
  // Index (order of add) of the failure that stopped the run, or -1.
  int first_failure() const;
  // Every worker's status; meaningful for the ones that ended.
  int status(size_t index) const;
  int rank(size_t index) const;
  pid_t pid(size_t index) const;
  size_t size() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hasten::detail
