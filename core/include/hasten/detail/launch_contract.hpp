// The contract between a launcher and its workers, shared by hasten::launch (core/src/launch.cpp)
// and `hasten launch` (apps/hasten/launcher.cpp) so that both give workers the same environment
// and describe their ends in the same words: the torchrun environment variables, the choice
// of a rendezvous port, and what a worker's wait status means.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace hasten::detail {

// Where one worker stands in the run.
struct WorkerPlace {
  int rank = 0;              // global
  int local_rank = 0;        // on this machine
  int world_size = 1;        // all machines
  int local_world_size = 1;  // this machine
  int group_rank = 0;        // this machine's index
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
};

// The torchrun variables a worker gets, in this order: RANK, LOCAL_RANK, WORLD_SIZE,
// LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT.
std::vector<std::pair<std::string, std::string>> torchrun_env(const WorkerPlace& place);

// A TCP port that nothing listens on now (bound and released), on the loopback address or on
// all interfaces; 0 when none can be bound.
int pick_free_port(bool loopback_only);
// Whether `port` can be bound on all interfaces now.
bool port_is_free(int port);

// A waitpid status in words: "exited with status N", "was killed by signal N (Name)".
std::string describe_exit(int status);
// "rank R (pid P) " followed by describe_exit(status): how both launchers name a failed worker.
std::string describe_worker_exit(int rank, int pid, int status);
// The exit code a launcher returns for a worker's status (a signal N gives 128 + N).
int exit_code_of(int status);

}  // namespace hasten::detail
