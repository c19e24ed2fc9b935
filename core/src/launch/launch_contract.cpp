// The launcher-worker contract both launchers share: torchrun environment variables,
// rendezvous ports, and exit statuses in words (core/include/hasten/detail/launch_contract.hpp).
#include <hasten/detail/launch_contract.hpp>
#include <hasten/error.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
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

std::string make_run_token() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(std::string("cannot make the run's token: getrandom failed: ") + std::strerror(errno));
    }
    got += static_cast<size_t>(n);
  }
  static const char* hex = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) {
    token.push_back(hex[b >> 4]);
    token.push_back(hex[b & 15]);
  }
  return token;
}

void check_run_token(const std::string& token) {
  if (token.empty()) return;
  bool printable_ascii = true;
  for (unsigned char ch : token) printable_ascii = printable_ascii && ch > 0x20 && ch < 0x7f;
  if (token.size() < 16 || token.size() > 256 || !printable_ascii)
    throw ConfigError(std::string(kRunTokenVariable) + " must be 16 to 256 printable characters without spaces (got " +
                      std::to_string(token.size()) + " characters" + (printable_ascii ? "" : ", some not printable") +
                      "); `openssl rand -hex 16` makes one");
}

bool same_secret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string printable(const std::string& text, size_t max_chars) {
  std::string out;
  for (unsigned char ch : text) {
    if (out.size() >= max_chars) {
      out += "...";
      break;
    }
    out.push_back(ch >= 0x20 && ch < 0x7f ? static_cast<char>(ch) : '?');
  }
  return out;
}

namespace {

// host's first address, numeric. Throws one line when host does not resolve.
std::string resolve_numeric(const std::string& host, const std::string& what) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0)
    throw Error(what + " '" + host + "' does not resolve on this machine: " + ::gai_strerror(rc));
  char numeric[NI_MAXHOST] = {0};
  const int rc = ::getnameinfo(found->ai_addr, found->ai_addrlen, numeric, sizeof numeric, nullptr, 0, NI_NUMERICHOST);
  ::freeaddrinfo(found);
  if (rc != 0) throw Error(what + " '" + host + "' does not resolve to a numeric address: " + ::gai_strerror(rc));
  return numeric;
}

bool is_numeric(const std::string& host) {
  in6_addr v6{};
  in_addr v4{};
  return ::inet_pton(AF_INET, host.c_str(), &v4) == 1 || ::inet_pton(AF_INET6, host.c_str(), &v6) == 1;
}

}  // namespace

bool is_loopback_address(const std::string& numeric) {
  in_addr v4{};
  in6_addr v6{};
  if (::inet_pton(AF_INET, numeric.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  if (::inet_pton(AF_INET6, numeric.c_str(), &v6) == 1)
    return IN6_IS_ADDR_LOOPBACK(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
  return false;
}

std::string bracketed_host(const std::string& numeric) {
  return numeric.find(':') != std::string::npos ? "[" + numeric + "]" : numeric;
}

std::string listen_address(const std::string& master_addr, bool spans_machines, const std::string& bind_override,
                           std::string* note) {
  if (!bind_override.empty()) return resolve_numeric(bind_override, "HASTEN_BIND_ADDR");
  const std::string address = resolve_numeric(master_addr, "MASTER_ADDR");
  if (is_loopback_address(address) && spans_machines && !is_numeric(master_addr) && master_addr != "localhost") {
    if (note != nullptr)
      *note = "MASTER_ADDR '" + master_addr + "' is " + address +
              " (loopback) on this machine, which other machines cannot reach: listening on every interface; "
              "HASTEN_BIND_ADDR narrows it";
    return address.find(':') != std::string::npos ? "::" : "0.0.0.0";
  }
  return address;
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
