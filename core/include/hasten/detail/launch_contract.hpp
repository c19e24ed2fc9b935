// The contract between a launcher and its workers, shared by hasten::launch (core/src/launch/launch.cpp)
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

// The run's secret (HASTEN_RUN_TOKEN): 32 hex digits from the kernel's random source, made
// by the launcher and handed to its workers in their environment (readable by the same user
// only). The store and the machine agents refuse a client that does not present it.
// Throws hasten::Error when no random bytes can be read.
std::string make_run_token();
inline constexpr const char* kRunTokenVariable = "HASTEN_RUN_TOKEN";
// Throws hasten::ConfigError with one line unless token is empty or 16 to 256 printable,
// non-space ASCII characters.
void check_run_token(const std::string& token);

// Whether two secrets are equal, compared in time that does not depend on where they first
// differ (their length is not secret: hasten's tokens are 32 hex digits).
bool same_secret(const std::string& a, const std::string& b);

// text with every control character (terminal escapes included) and every byte outside
// printable ASCII shown as '?', cut to max_chars: what a launcher prints of anything a
// network peer or a worker sent it.
std::string printable(const std::string& text, size_t max_chars = 200);

// The numeric address a run's listener (rank 0's store, machine 0's launcher agent) binds:
// bind_override (HASTEN_BIND_ADDR) where non-empty, "0.0.0.0" or "::" meaning every interface;
// otherwise the address master_addr resolves to here, so that a run on one machine (hasten's
// launchers give it 127.0.0.1) listens on loopback only and a run across machines on the
// address the others reach. One case is widened: a name (not a numeric address, not
// "localhost") that resolves to loopback here on a run that spans machines (Debian's
// /etc/hosts maps a machine's own name to 127.0.1.1, while the other machines resolve it to
// its network address): every interface then, and *note says so in one line.
// Throws hasten::Error when a name does not resolve.
std::string listen_address(const std::string& master_addr, bool spans_machines, const std::string& bind_override,
                           std::string* note);
// Whether a numeric address is a loopback address (127.0.0.0/8, ::1).
bool is_loopback_address(const std::string& numeric);
// A numeric address as host[:port] spelling wants it: IPv6 in brackets.
std::string bracketed_host(const std::string& numeric);

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
