// hasten::launch: runs a function in several worker processes of this machine with the same
// environment contract as `hasten launch` (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT), the counterpart of Accelerate's notebook_launcher and
// debug_launcher: tests and tools can exercise distributed code without a separate binary.
//
//   hasten::launch([] {
//     hasten::Accelerator acc;       // sees RANK/WORLD_SIZE and rendezvouses
//     ...
//   }, 2);
//
// The workers are fork()ed: call it before the calling process starts threads of its own
// (LibTorch's intra-op pool included), as with any fork, and before any CUDA work: a process
// that holds a CUDA context is refused with an Error (forked children cannot use CUDA). Workers are killed (SIGKILL) when the
// thread that called launch() ends, so a caller killed with SIGKILL leaves none behind; call
// it from a thread that outlives the launch (the main thread, as a rule).
#pragma once

#include <functional>
#include <map>
#include <string>

namespace hasten {

struct LaunchOptions {
  int num_processes = 2;
  double timeout_s = 600;   // the whole launch; workers still running then are killed
  double grace_s = 5;       // SIGTERM to SIGKILL when stopping workers
  std::map<std::string, std::string> env;  // extra variables for every worker
};

// Runs fn in every worker. A worker that throws prints "hasten::launch: rank R: <message>"
// and exits 1. Returns when every worker exited 0; otherwise stops the others and throws
// hasten::Error naming the first failed rank, its pid and its exit status or signal.
void launch(const std::function<void()>& fn, const LaunchOptions& options);
inline void launch(const std::function<void()>& fn, int num_processes) {
  LaunchOptions options;
  options.num_processes = num_processes;
  launch(fn, options);
}

}  // namespace hasten
