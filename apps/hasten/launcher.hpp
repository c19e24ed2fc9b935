// The local half of `hasten launch`: starts this machine's workers with the torchrun
// environment contract, prefixes their output with the rank, forwards signals, and when one
// worker fails stops the others (SIGTERM, then SIGKILL after a grace period) and returns the
// failed worker's status. The environment contract, port checks and exit-status words are the
// core's (hasten/detail/launch_contract.hpp), shared with hasten::launch.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace hasten::cli {

struct LaunchPlan {
  std::vector<std::string> command;  // program and its arguments
  int world_size = 1;                // all machines
  int local_world_size = 1;          // this machine
  int machine_rank = 0;
  int num_machines = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::vector<std::pair<std::string, std::string>> env;  // set on every worker
  std::string run_token;  // the run's secret (HASTEN_RUN_TOKEN); empty: none (printed nowhere)
  bool prefix_output = false;
  std::string log_dir;  // non-empty: also write rank_<r>.log there
  bool echo = true;     // false: workers' output only to log_dir, and no launcher lines (hasten test)
  double grace_s = 5.0;
  // Runs across machines (machine_agents.hpp): polled while the workers run, true stops them
  // (another machine's worker failed); told of the first local failure the moment it happens.
  std::function<bool()> stop_requested;
  std::function<void(int rank, const std::string& what)> on_failure;

  int global_rank(int local_rank) const { return machine_rank * local_world_size + local_rank; }
  // The variables a worker gets on top of the launcher's environment.
  std::vector<std::pair<std::string, std::string>> worker_env(int local_rank) const;
};

// Runs the workers to completion; returns the exit status for the launcher. *interrupted
// (when given) tells whether the launcher itself was signalled (SIGINT, SIGTERM, SIGHUP);
// *failed_rank (when given) is the global rank of the first worker that failed, else -1.
int run_workers(const LaunchPlan& plan, bool* interrupted = nullptr, int* failed_rank = nullptr);

}  // namespace hasten::cli
