// The launcher-worker contract both launchers share: torchrun environment variables,
// rendezvous ports, and exit statuses in words (core/include/hasten/detail/launch_contract.hpp).
#include <hasten/detail/launch_contract.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

namespace hasten::detail {

std::vector<std::pair<std::string, std::string>> torchrun_env(const WorkerPlace& place) {
  return {{"RANK", std::to_string(place.rank)},
          {"LOCAL_RANK", std::to_string(place.local_rank)},
          {"WORLD_SIZE", std::to_string(place.world_size)},
          {"LOCAL_WORLD_SIZE", std::to_string(place.local_world_size)},
          {"GROUP_RANK", std::to_string(place.group_rank)},
          {"MASTER_ADDR", place.master_addr},
          {"MASTER_PORT", std::to_string(place.master_port)}};
}

int pick_free_port(bool loopback_only) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(loopback_only ? INADDR_LOOPBACK : INADDR_ANY);
  addr.sin_port = 0;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    socklen_t len = sizeof addr;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

bool port_is_free(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

std::string describe_exit(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = ::strsignal(sig);
    return "was killed by signal " + std::to_string(sig) + " (" + (name ? name : "?") + ")";
  }
  return "ended with status " + std::to_string(status);
}

std::string describe_worker_exit(int rank, int pid, int status) {
  return "rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + ") " + describe_exit(status);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace hasten::detail
