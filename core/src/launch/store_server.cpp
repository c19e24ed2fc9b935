#include "launch/store_server.hpp"

#include <hasten/detail/launch_contract.hpp>
#include <hasten/error.hpp>
#include <hasten/logging.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <thread>
#include <unordered_map>
#include <vector>

#include "launch/store_protocol.hpp"

namespace hasten::detail {

namespace {

namespace sp = store_protocol;
using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

// Refusals logged before the server goes quiet about them (a port scan must not flood the log).
constexpr int kMaxRefusalLines = 20;

std::string peer_name(const sockaddr_storage& addr) {
  char host[NI_MAXHOST] = {0}, port[NI_MAXSERV] = {0};
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&addr), sizeof addr, host, sizeof host, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "an unknown address";
  return std::string(addr.ss_family == AF_INET6 ? "[" : "") + host + (addr.ss_family == AF_INET6 ? "]" : "") + ":" +
         port;
}

struct ClientState {
  int fd = -1;
  std::string peer;
  std::string in, out;
  bool authenticated = false;
  bool closing = false;  // close once `out` is written
  Clock::time_point hello_deadline;
};

struct Waiter {
  int fd;
  std::string key;
  Clock::time_point deadline;
};

class Server {
 public:
  Server(int listen_fd, StoreServerOptions options, std::string where)
      : listen_fd_(listen_fd), options_(std::move(options)), where_(std::move(where)) {}

  void run() {
    for (;;) {
      std::vector<pollfd> fds;
      fds.push_back({listen_fd_, POLLIN, 0});
      for (auto& [fd, c] : clients_) fds.push_back({fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
      ::poll(fds.data(), fds.size(), next_timeout_ms());
      for (const auto& p : fds) {
        if (p.revents == 0) continue;
        if (p.fd == listen_fd_) {
          accept_clients();
          continue;
        }
        auto it = clients_.find(p.fd);
        if (it == clients_.end()) continue;
        if (p.revents & POLLOUT) flush(it->second);
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) receive(it->second);
      }
      expire();
      for (auto it = clients_.begin(); it != clients_.end();) {
        if (it->second.fd < 0) {
          it = clients_.erase(it);
        } else {
          ++it;
        }
      }
    }
  }

 private:
  int next_timeout_ms() const {
    auto next = Clock::now() + Ms(1000);
    for (const auto& w : waiters_) next = std::min(next, w.deadline);
    for (const auto& [fd, c] : clients_)
      if (!c.authenticated) next = std::min(next, c.hello_deadline);
    return static_cast<int>(std::max<int64_t>(0, std::chrono::duration_cast<Ms>(next - Clock::now()).count() + 1));
  }

  void refuse_line(const std::string& line) {
    if (refusals_ < kMaxRefusalLines)
      get_logger("hasten", false)->warn("store at {}: {}", where_, line);
    else if (refusals_ == kMaxRefusalLines)
      get_logger("hasten", false)->warn("store at {}: more refused connections follow; not shown", where_);
    ++refusals_;
  }

  void accept_clients() {
    for (;;) {
      sockaddr_storage addr{};
      socklen_t len = sizeof addr;
      const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        // EMFILE and the like: the pending connection stays queued; the next poll retries
        // after at most the poll timeout instead of spinning.
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) std::this_thread::sleep_for(Ms(50));
        return;
      }
      if (static_cast<int>(clients_.size()) >= options_.max_clients) {
        refuse_line("refused a connection from " + peer_name(addr) + ": " + std::to_string(options_.max_clients) +
                    " connections are open already");
        ::close(fd);
        continue;
      }
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      ClientState c;
      c.fd = fd;
      c.peer = peer_name(addr);
      c.hello_deadline = Clock::now() + Ms(sp::kHelloWithinMs);
      clients_[fd] = std::move(c);
    }
  }

  void drop(ClientState& c) {
    if (c.fd < 0) return;
    for (auto it = waiters_.begin(); it != waiters_.end();) it = it->fd == c.fd ? waiters_.erase(it) : it + 1;
    ::close(c.fd);
    c.fd = -1;
  }

  void flush(ClientState& c) {
    while (!c.out.empty()) {
      const ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        if (errno == EINTR) continue;
        drop(c);
        return;
      }
      c.out.erase(0, static_cast<size_t>(n));
    }
    if (c.closing) drop(c);
  }

  void reply(ClientState& c, sp::Status status, const std::string& payload) {
    c.out += sp::answer(status, payload);
    flush(c);
  }

  void receive(ClientState& c) {
    char buf[65536];
    for (;;) {
      const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
      if (n == 0) {
        drop(c);
        return;
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) drop(c);
        break;
      }
      if (c.closing) continue;  // a refused client: what it sends is not read
      c.in.append(buf, static_cast<size_t>(n));
      // Whole frames are handled as they arrive, so what is buffered is at most one frame
      // (at most kMaxHelloFrame bytes before the hello is accepted) and one read.
      while (c.fd >= 0 && !c.closing && c.in.size() >= 4) {
        const uint32_t len = sp::get_u32(c.in.data());
        const uint32_t limit = c.authenticated ? sp::kMaxFrame : sp::kMaxHelloFrame;
        if (len > limit) {
          refuse_line("closed the connection from " + c.peer + ": it sent a request of " + std::to_string(len) +
                      " bytes (at most " + std::to_string(limit) + " are allowed" +
                      (c.authenticated ? "" : " before the hello") + ")");
          drop(c);
          return;
        }
        if (c.in.size() < 4 + static_cast<size_t>(len)) break;
        const std::string body = c.in.substr(4, len);
        c.in.erase(0, 4 + static_cast<size_t>(len));
        handle(c, body);
      }
      if (c.fd < 0) return;
    }
  }

  void handle(ClientState& c, const std::string& body) {
    if (body.size() < 5 || sp::get_u32(body.data() + 1) > sp::kMaxKey || 5 + sp::get_u32(body.data() + 1) > body.size()) {
      refuse_line("closed the connection from " + c.peer + ": it sent a malformed request (not hasten's store protocol)");
      drop(c);
      return;
    }
    const auto op = static_cast<uint8_t>(body[0]);
    const uint32_t key_len = sp::get_u32(body.data() + 1);
    const std::string key = body.substr(5, key_len);
    const std::string payload = body.substr(5 + key_len);
    if (!c.authenticated) {
      if (op != sp::kHello || key != sp::kName) {
        refuse_line("refused the connection from " + c.peer + ": it did not open with hasten's store hello " +
                    "(a client of another protocol, or of an older hasten)");
        c.closing = true;
        reply(c, sp::kRefused, "this store speaks " + std::string(sp::kName) + " and expects a hello first");
        return;
      }
      if (!same_secret(payload, options_.token)) {
        refuse_line("refused the connection from " + c.peer + ": " +
                    (payload.empty() ? "it presented no run token" : "it presented another run's token") +
                    " (HASTEN_RUN_TOKEN)");
        c.closing = true;
        reply(c, sp::kRefused,
              payload.empty() ? "this run's store needs the run's token (HASTEN_RUN_TOKEN), and none was presented"
                              : "the run token presented (HASTEN_RUN_TOKEN) is not this run's");
        return;
      }
      c.authenticated = true;
      reply(c, sp::kOk, "");
      return;
    }
    switch (op) {
      case sp::kSet:
        data_[key] = payload;
        reply(c, sp::kOk, "");
        wake(key);
        return;
      case sp::kGet: {
        auto it = data_.find(key);
        if (it == data_.end()) {
          reply(c, sp::kMissing, "");
        } else {
          reply(c, sp::kOk, it->second);
        }
        return;
      }
      case sp::kCheck:
        reply(c, sp::kOk, std::string(1, data_.count(key) ? '\1' : '\0'));
        return;
      case sp::kAdd: {
        if (payload.size() != 8) return bad(c, "an add without its 8-byte delta");
        int64_t value = 0;
        auto it = data_.find(key);
        if (it != data_.end() && !parse_int(it->second, value))
          return bad(c, "an add to key '" + printable(key) + "', whose value is not a number");
        const int64_t delta = sp::get_i64(payload.data());
        if (__builtin_add_overflow(value, delta, &value)) return bad(c, "an add that overflows key '" + printable(key) + "'");
        data_[key] = std::to_string(value);
        std::string out;
        sp::put_i64(out, value);
        reply(c, sp::kOk, out);
        wake(key);
        return;
      }
      case sp::kWait: {
        if (payload.size() != 8) return bad(c, "a wait without its 8-byte timeout");
        auto it = data_.find(key);
        if (it != data_.end()) return reply(c, sp::kOk, it->second);
        const int64_t ms = std::clamp<int64_t>(sp::get_i64(payload.data()), 0, int64_t{1} << 40);
        waiters_.push_back({c.fd, key, Clock::now() + Ms(ms)});
        return;
      }
      default:
        return bad(c, "an unknown request (op " + std::to_string(op) + ")");
    }
  }

  static bool parse_int(const std::string& text, int64_t& out) {
    if (text.empty() || text.size() > 20) return false;
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (errno != 0 || end != text.c_str() + text.size()) return false;
    out = v;
    return true;
  }

  void bad(ClientState& c, const std::string& why) {
    refuse_line("closed the connection from " + c.peer + ": it sent " + why);
    c.closing = true;
    reply(c, sp::kBadRequest, why);
  }

  void wake(const std::string& key) {
    const std::string& value = data_[key];
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->key != key) {
        ++it;
        continue;
      }
      const int fd = it->fd;
      it = waiters_.erase(it);
      auto c = clients_.find(fd);
      if (c != clients_.end() && c->second.fd >= 0) reply(c->second, sp::kOk, value);
    }
  }

  void expire() {
    const auto now = Clock::now();
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->deadline > now) {
        ++it;
        continue;
      }
      const int fd = it->fd;
      it = waiters_.erase(it);
      auto c = clients_.find(fd);
      if (c != clients_.end() && c->second.fd >= 0) reply(c->second, sp::kTimeout, "");
    }
    for (auto& [fd, c] : clients_)
      if (c.fd >= 0 && !c.authenticated && !c.closing && c.hello_deadline <= now) {
        get_logger("hasten", false)->debug("store at {}: closed a connection from {} that said nothing within {} s",
                                           where_, c.peer, sp::kHelloWithinMs / 1000);
        drop(c);
      }
  }

  int listen_fd_;
  StoreServerOptions options_;
  std::string where_;
  std::map<int, ClientState> clients_;
  std::vector<Waiter> waiters_;
  std::unordered_map<std::string, std::string> data_;
  int refusals_ = 0;
};

}  // namespace

void start_store_server(const StoreServerOptions& options) {
  const std::string where = (options.bind_host.find(':') != std::string::npos ? "[" + options.bind_host + "]"
                                                                               : options.bind_host) +
                            ":" + std::to_string(options.port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(options.port);
  if (const int rc = ::getaddrinfo(options.bind_host.c_str(), port.c_str(), &hints, &found); rc != 0)
    throw Error("rendezvous: rank 0 cannot host the store at " + where + ": '" + options.bind_host +
                "' is not a numeric address (" + ::gai_strerror(rc) + ")");
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> hold(found, &::freeaddrinfo);
  const int fd = ::socket(found->ai_family, found->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, found->ai_protocol);
  if (fd < 0) throw Error("rendezvous: rank 0 cannot host the store at " + where + ": " + std::strerror(errno));
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (found->ai_family == AF_INET6) {
    // "::" means every interface, IPv4 included, as c10d's store listened.
    int zero = 0;
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  }
  if (::bind(fd, found->ai_addr, found->ai_addrlen) != 0 || ::listen(fd, 1024) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    throw Error("rendezvous: rank 0 cannot host the store at " + where + ": " + why +
                (errno == EADDRINUSE ? " (another process listens on that port; pick another MASTER_PORT)"
                                     : errno == EADDRNOTAVAIL ? " (not an address of this machine; set HASTEN_BIND_ADDR)"
                                                              : ""));
  }
  // The server outlives every Accelerator: ranks that are still setting up through it must
  // not lose it, and it ends with the process (nothing joins it).
  auto* server = new Server(fd, options, where);
  std::thread([server] { server->run(); }).detach();
}

}  // namespace hasten::detail
