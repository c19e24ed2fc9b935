#include "launch/store_client.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "launch/store_protocol.hpp"
#include "util/text_util.hpp"

namespace hasten::detail {

namespace {

namespace sp = store_protocol;
using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

int ms_left(Clock::time_point deadline) {
  return static_cast<int>(std::max<int64_t>(0, std::chrono::duration_cast<Ms>(deadline - Clock::now()).count()));
}

// Connects to one address within the deadline; -1 with errno set otherwise.
int connect_one(const addrinfo* a, Clock::time_point deadline) {
  const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
  if (fd < 0) return -1;
  if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      const int e = errno;
      ::close(fd);
      errno = e;
      return -1;
    }
    pollfd p{fd, POLLOUT, 0};
    int rc;
    while ((rc = ::poll(&p, 1, ms_left(deadline))) < 0 && errno == EINTR) {
    }
    int err = 0;
    socklen_t len = sizeof err;
    if (rc == 0) err = ETIMEDOUT;
    else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err != 0) {
      ::close(fd);
      errno = err;
      return -1;
    }
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

class StoreConnection final : public StoreWire {
 public:
  StoreConnection(int fd, std::string where) : fd_(fd), where_(std::move(where)) {}
  ~StoreConnection() override { ::close(fd_); }
  StoreConnection(const StoreConnection&) = delete;
  StoreConnection& operator=(const StoreConnection&) = delete;

  // Sends one request and returns the answer's status and payload.
  std::pair<sp::Status, std::string> call(const std::string& what, sp::Op op, const std::string& key,
                                          const std::string& payload, int64_t timeout_ms) {
    // The deadline counts from the call, not from when the connection is free: a call queued
    // behind another thread's long wait is held to its own.
    const auto deadline = Clock::now() + Ms(timeout_ms);
    std::unique_lock<std::timed_mutex> one_at_a_time(mutex_, std::defer_lock);
    if (!one_at_a_time.try_lock_until(deadline))
      throw StoreNoAnswer("store: " + what + " got no turn on the connection to the store at " + where_ + " within " +
                          seconds_text(timeout_ms) + " s (another call of this process holds it)");
    if (broken_) throw StoreNoAnswer("store: " + what + " refused: an earlier call to the store at " + where_ + " " + broken_why_);
    const std::string frame = sp::request(op, key, payload);
    size_t sent = 0;
    while (sent < frame.size()) {
      const ssize_t n = ::send(fd_, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
      if (n >= 0) {
        sent += static_cast<size_t>(n);
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        wait_for(POLLOUT, deadline, what, timeout_ms);
      } else if (errno != EINTR) {
        closed(what);
      }
    }
    std::string head = read_exact(4, deadline, what, timeout_ms);
    const uint32_t len = sp::get_u32(head.data());
    if (len < 1 || len > sp::kMaxFrame) {
      broken("answered with a frame of " + std::to_string(len) + " bytes");
      throw StoreNoAnswer("store: " + what + ": the store at " + where_ + " answered with a malformed frame");
    }
    std::string body = read_exact(len, deadline, what, timeout_ms);
    return {static_cast<sp::Status>(static_cast<uint8_t>(body[0])), body.substr(1)};
  }

  void set(const std::string& key, const std::vector<uint8_t>& value, int64_t timeout_ms) override {
    expect_ok("set of key '" + key + "'", call("set of key '" + key + "'", sp::kSet, key, {value.begin(), value.end()}, timeout_ms));
  }
  std::vector<uint8_t> get(const std::string& key, int64_t timeout_ms) override {
    const std::string what = "get of key '" + key + "'";
    auto [status, payload] = call(what, sp::kGet, key, "", timeout_ms);
    if (status == sp::kMissing) throw Error("store: key '" + key + "' is not in the store at " + where_);
    expect_ok(what, {status, payload});
    return {payload.begin(), payload.end()};
  }
  std::vector<uint8_t> wait_get(const std::string& key, int64_t wait_ms) override {
    const std::string what = "wait for key '" + key + "'";
    std::string ms;
    sp::put_i64(ms, wait_ms);
    // The store answers at wait_ms; the margin is for one that never does.
    auto [status, payload] = call(what, sp::kWait, key, ms, wait_ms + 2000);
    if (status == sp::kTimeout)
      throw StoreKeyTimeout("store: key '" + key + "' did not appear within " + seconds_text(wait_ms) + " s");
    expect_ok(what, {status, payload});
    return {payload.begin(), payload.end()};
  }
  int64_t add(const std::string& key, int64_t delta, int64_t timeout_ms) override {
    const std::string what = "add to key '" + key + "'";
    std::string d;
    sp::put_i64(d, delta);
    auto answer = call(what, sp::kAdd, key, d, timeout_ms);
    expect_ok(what, answer);
    if (answer.second.size() != 8) throw StoreClosed("store: " + what + ": the store at " + where_ + " answered out of protocol");
    return sp::get_i64(answer.second.data());
  }
  bool check(const std::string& key, int64_t timeout_ms) override {
    const std::string what = "check of key '" + key + "'";
    auto answer = call(what, sp::kCheck, key, "", timeout_ms);
    expect_ok(what, answer);
    return answer.second.size() == 1 && answer.second[0] == '\1';
  }

 private:
  void expect_ok(const std::string& what, const std::pair<sp::Status, std::string>& answer) {
    if (answer.first == sp::kOk) return;
    if (answer.first == sp::kRefused) throw StoreRefused("store: the store at " + where_ + " refused this rank: " + answer.second);
    throw Error("store: " + what + " failed at the store at " + where_ + ": " + answer.second);
  }

  void broken(const std::string& why) {
    broken_why_ = why;
    broken_ = true;
  }

  [[noreturn]] void closed(const std::string& what) {
    const std::string why = std::strerror(errno);
    broken("closed the connection");
    throw StoreClosed("store: " + what + ": the store at " + where_ + " closed the connection (" + why + ")");
  }

  void wait_for(short events, Clock::time_point deadline, const std::string& what, int64_t timeout_ms) {
    pollfd p{fd_, events, 0};
    for (;;) {
      const int rc = ::poll(&p, 1, ms_left(deadline));
      if (rc > 0) return;
      if (rc < 0 && errno == EINTR) continue;
      broken("got no answer within " + seconds_text(timeout_ms) + " s");
      throw StoreNoAnswer("store: " + what + " got no answer from the store at " + where_ + " within " + seconds_text(timeout_ms) +
                          " s (its host stopped, or something that is not a hasten store answers on that port)");
    }
  }

  std::string read_exact(size_t n, Clock::time_point deadline, const std::string& what, int64_t timeout_ms) {
    std::string out(n, '\0');
    size_t got = 0;
    while (got < n) {
      const ssize_t r = ::recv(fd_, out.data() + got, n - got, 0);
      if (r > 0) {
        got += static_cast<size_t>(r);
      } else if (r == 0) {
        errno = ECONNRESET;
        closed(what);
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        wait_for(POLLIN, deadline, what, timeout_ms);
      } else if (errno != EINTR) {
        closed(what);
      }
    }
    return out;
  }

  int fd_;
  std::string where_;
  std::timed_mutex mutex_;
  bool broken_ = false;
  std::string broken_why_;
};

}  // namespace

std::unique_ptr<StoreWire> connect_store(const std::string& host, int port, const std::string& token,
                                         int64_t connect_ms, int64_t hello_ms) {
  const std::string where = host + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0)
    throw StoreUnreachable("cannot resolve '" + host + "': " + ::gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> hold(found, &::freeaddrinfo);
  const auto deadline = Clock::now() + Ms(connect_ms);
  int fd = -1;
  std::string why = "no address";
  for (const addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = connect_one(a, deadline);
    if (fd < 0) why = std::strerror(errno);
  }
  if (fd < 0) throw StoreUnreachable(why);
  auto client = std::make_unique<StoreConnection>(fd, where);
  auto [status, payload] = client->call("hello", sp::kHello, sp::kName, token, hello_ms);
  if (status == sp::kRefused) throw StoreRefused("the store at " + where + " refused this rank: " + payload);
  if (status != sp::kOk) throw StoreNoAnswer("the store at " + where + " answered the hello out of protocol");
  return client;
}

}  // namespace hasten::detail
