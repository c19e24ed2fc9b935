// The launchers' agreement on rounds of workers across machines (machine_agents.hpp): machine
// 0's coordinator thread, and every launcher's connection to it.
#include "machine_agents.hpp"

#include <hasten/detail/launch_contract.hpp>
#include <hasten/error.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <iostream>
#include <sstream>
#include <thread>
#include <vector>

namespace hasten::cli {

namespace {

using Clock = std::chrono::steady_clock;

// Sends one line whole; false when the peer is gone. MSG_NOSIGNAL: a closed peer is an
// error to handle, not a SIGPIPE that kills the launcher.
bool send_line(int fd, std::string line) {
  line += '\n';
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::send(fd, line.data() + done, line.size() - done, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

// The longest line a launcher sends (a FAIL with a worker's last words is the longest):
// a peer that sends more without a newline is not a launcher of this run.
constexpr size_t kMaxLine = 16384;

// Reads what is there into buf and moves whole lines to out; false at EOF, on an error, or
// when a line grows past kMaxLine.
bool read_lines(int fd, std::string& buf, std::deque<std::string>& out) {
  char chunk[4096];
  const ssize_t n = ::recv(fd, chunk, sizeof chunk, MSG_DONTWAIT);
  if (n == 0) return false;
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  buf.append(chunk, static_cast<size_t>(n));
  for (size_t nl; (nl = buf.find('\n')) != std::string::npos;) {
    out.push_back(buf.substr(0, nl));
    buf.erase(0, nl + 1);
  }
  return buf.size() <= kMaxLine;
}

// "WORD a b rest of the line" -> the first `fields` words, then the rest (which may hold spaces).
std::vector<std::string> split_fields(const std::string& line, size_t fields) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (out.size() < fields && pos <= line.size()) {
    const size_t sp = line.find(' ', pos);
    out.push_back(line.substr(pos, sp == std::string::npos ? std::string::npos : sp - pos));
    if (sp == std::string::npos) return out;
    pos = sp + 1;
  }
  out.push_back(pos <= line.size() ? line.substr(pos) : "");
  return out;
}

int to_int(const std::string& s, int fallback = -1) {
  try {
    size_t used = 0;
    const int v = std::stoi(s, &used);
    return used == s.size() ? v : fallback;
  } catch (const std::exception&) {
    return fallback;
  }
}

// Machine 0's coordinator: joins the launchers, starts rounds, turns the first failure of a
// round into a stop everywhere and the round's end into a restart or the end of the run.
class Coordinator {
 public:
  explicit Coordinator(const MachineAgents::Settings& s) : s_(s), port_(s.master_port) {
    // The address the other machines reach (main_process_ip), not every interface.
    std::string note;
    bind_host_ = detail::listen_address(s.main_addr, /*spans_machines=*/true, s.bind_override, &note);
    if (!note.empty()) std::cerr << "hasten launch: " << note << std::endl;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE;
    addrinfo* found = nullptr;
    if (const int rc = ::getaddrinfo(bind_host_.c_str(), std::to_string(s.agent_port).c_str(), &hints, &found); rc != 0)
      throw Error("hasten launch: cannot listen on " + bind_host_ + ": " + ::gai_strerror(rc));
    listen_fd_ = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) {
      ::freeaddrinfo(found);
      throw Error(std::string("hasten launch: socket: ") + std::strerror(errno));
    }
    const int one = 1, zero = 0;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (found->ai_family == AF_INET6) ::setsockopt(listen_fd_, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);  // "::": IPv4 too
    const int rc = ::bind(listen_fd_, found->ai_addr, found->ai_addrlen);
    ::freeaddrinfo(found);
    if (rc != 0 || ::listen(listen_fd_, 64) != 0) {
      const std::string why = std::strerror(errno);
      ::close(listen_fd_);
      throw Error("hasten launch: cannot listen on " + detail::bracketed_host(bind_host_) + ":" +
                  std::to_string(s.agent_port) +
                  " (main_process_port + 1, where machine 0's launcher coordinates restarts across machines): " + why);
    }
    thread_ = std::thread([this] { run(); });
  }

  // Where machine 0's own launcher reaches the coordinator.
  std::string local_address() const {
    if (bind_host_ == "0.0.0.0") return "127.0.0.1";
    if (bind_host_ == "::") return "::1";
    return bind_host_;
  }

  ~Coordinator() {
    quit_.store(true);
    if (thread_.joinable()) thread_.join();
    for (auto& p : peers_)
      if (p.fd >= 0) ::close(p.fd);
    ::close(listen_fd_);
  }

 private:
  struct Peer {
    int fd = -1;
    int machine = -1;  // after JOIN
    std::string address;  // where it connected from
    Clock::time_point join_by;  // a connection that has not joined by then is closed
    std::string buf;
    bool ended = false;
  };

  // A JOIN must come this soon after connecting.
  static constexpr std::chrono::seconds kJoinWithin{10};
  // Connections beyond this many are closed at once (a launcher needs one).
  size_t max_peers() const { return static_cast<size_t>(2 * s_.num_machines + 8); }

  void refuse_line(const std::string& line) {
    if (refusals_ < 20) std::cerr << "hasten launch: " << line << std::endl;
    else if (refusals_ == 20) std::cerr << "hasten launch: more refused connections follow; not shown" << std::endl;
    ++refusals_;
  }

  void run() {
    const auto join_deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(s_.join_timeout_s * 1000));
    while (!quit_.load() && !over_) {
      std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
      for (auto& p : peers_) fds.push_back({p.fd, POLLIN, 0});
      ::poll(fds.data(), fds.size(), 100);
      if (fds[0].revents & POLLIN) {
        sockaddr_storage from{};
        socklen_t len = sizeof from;
        const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&from), &len, SOCK_CLOEXEC);
        char host[NI_MAXHOST] = "?";
        if (fd >= 0)
          ::getnameinfo(reinterpret_cast<sockaddr*>(&from), len, host, sizeof host, nullptr, 0, NI_NUMERICHOST);
        if (fd < 0) {
          // Out of descriptors (EMFILE): the connection stays queued and poll would report it
          // again at once; a pause keeps this thread from spinning.
          if (errno != EAGAIN && errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        } else if (peers_.size() >= max_peers()) {
          refuse_line(std::string("refused a connection from ") + host + ": " + std::to_string(max_peers()) +
                      " are open already");
          ::close(fd);
        } else {
          const int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          // A peer that stops reading must not stall the coordinator in a broadcast.
          const timeval send_limit{5, 0};
          ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_limit, sizeof send_limit);
          Peer peer;
          peer.fd = fd;
          peer.address = host;
          peer.join_by = Clock::now() + kJoinWithin;
          peers_.push_back(std::move(peer));
        }
      }
      for (auto& p : peers_)
        if (p.fd >= 0 && p.machine < 0 && Clock::now() > p.join_by) {
          refuse_line("closed a connection from " + p.address + ": it did not join within " +
                      std::to_string(kJoinWithin.count()) + " s");
          ::close(p.fd);
          p.fd = -1;
        }
      for (size_t i = 1; i < fds.size() && !over_; ++i) {
        if (fds[i].revents == 0) continue;
        Peer& p = peers_[i - 1];
        std::deque<std::string> lines;
        const bool open = read_lines(p.fd, p.buf, lines);
        if (!open && p.buf.size() > kMaxLine)
          refuse_line("closed the connection from " + p.address + ": it sent a line longer than " +
                      std::to_string(kMaxLine) + " bytes");
        for (auto& line : lines)
          if (!over_) handle(p, line);
        if (!open && !over_) gone(p);
      }
      // Peers refused or gone are dropped (their sockets closed).
      for (auto it = peers_.begin(); it != peers_.end();)
        if (it->fd < 0) it = peers_.erase(it);
        else ++it;
      if (round_ < 0 && !over_ && Clock::now() > join_deadline) {
        std::string missing;
        for (int m = 0; m < s_.num_machines; ++m)
          if (!joined(m)) missing += (missing.empty() ? "" : ", ") + std::to_string(m);
        end_run(1, "machine" + std::string(missing.find(',') == std::string::npos ? " " : "s ") + missing +
                       " did not join within rendezvous_timeout_s (" + std::to_string(static_cast<int>(s_.join_timeout_s)) +
                       " s); start `hasten launch` on every machine with the same num_machines, main_process_ip and "
                       "main_process_port");
      }
    }
  }

  bool joined(int machine) const {
    for (auto& p : peers_)
      if (p.machine == machine && p.fd >= 0) return true;
    return false;
  }

  void broadcast(const std::string& line) {
    for (auto& p : peers_)
      if (p.machine >= 0 && p.fd >= 0) send_line(p.fd, line);
  }

  void handle(Peer& p, const std::string& line) {
    const auto f = split_fields(line, 1);
    if (p.machine < 0 && f[0] != "JOIN") {
      refuse_line("closed a connection from " + p.address + ": it did not start with JOIN (not a hasten launcher)");
      ::close(p.fd);
      p.fd = -1;
      return;
    }
    if (f[0] == "JOIN") {
      const auto j = split_fields(line, 2);  // JOIN machine token
      const int m = to_int(j.size() > 1 ? j[1] : "");
      const std::string token = j.size() > 2 ? j[2] : "";
      std::string refusal;
      if (p.machine >= 0) return;  // joined already
      if (!detail::same_secret(token, s_.token)) {
        refuse_line("refused a launcher from " + p.address + ": " +
                    (token.empty() ? "it presented no run token" : "it presented another run's token") + " (" +
                    detail::kRunTokenVariable + ")");
        refusal = std::string("machine 0's launcher refused this machine: ") +
                  (token.empty() ? "it has a run token and this launcher presented none"
                                 : "the run token presented is not this run's") +
                  " (set the same " + detail::kRunTokenVariable + " on every machine)";
      } else if (m < 0 || m >= s_.num_machines)
        refusal = "machine_rank " + detail::printable(j.size() > 1 ? j[1] : std::string("?"), 20) + " is out of range for num_machines " +
                  std::to_string(s_.num_machines) + " (allowed: 0 to " + std::to_string(s_.num_machines - 1) + ")";
      else if (joined(m))
        refusal = "machine_rank " + std::to_string(m) + " is taken by another launcher (give every machine its own machine_rank)";
      else if (round_ >= 0)
        refusal = "the run has already started";
      if (!refusal.empty()) {
        send_line(p.fd, "EXIT 1 " + refusal);
        ::close(p.fd);
        p.fd = -1;
        return;
      }
      p.machine = m;
      int count = 0;
      for (auto& q : peers_) count += q.machine >= 0 && q.fd >= 0;
      if (count == s_.num_machines) start_round(0);
      return;
    }
    if (p.machine < 0) return;  // nothing before JOIN counts
    if (f[0] == "FAIL") {
      const auto g = split_fields(line, 3);  // FAIL round rank what
      if (g.size() < 4 || to_int(g[1]) != round_ || failed_) return;
      failed_ = true;
      // What a worker said reaches every machine's terminal: no control characters.
      const std::string what = detail::printable(g[3], 2000);
      failure_ = "machine " + std::to_string(p.machine) + ": " + what;
      broadcast("STOP " + std::to_string(round_) + " " + std::to_string(p.machine) + " " + what);
    } else if (f[0] == "END") {
      const auto g = split_fields(line, 3);  // END round code interrupted
      if (g.size() < 4 || to_int(g[1]) != round_ || p.ended) return;
      p.ended = true;
      const int code = to_int(g[2], 1);
      if (g[3] == "1") interrupted_ = true;
      if (code != 0 && fail_code_ == 0) fail_code_ = code;
      if (code != 0 && !failed_) {
        failed_ = true;
        failure_ = "machine " + std::to_string(p.machine) + ": its launcher ended the round with status " + std::to_string(code);
        broadcast("STOP " + std::to_string(round_) + " " + std::to_string(p.machine) + " its launcher ended the round with status " +
                  std::to_string(code));
      }
      for (auto& q : peers_)
        if (q.machine >= 0 && !q.ended) return;
      finish_round();
    }
  }

  void gone(Peer& p) {
    const int m = p.machine;
    ::close(p.fd);
    p.fd = -1;
    if (m < 0) return;
    end_run(1, "the launcher of machine " + std::to_string(m) +
                   " disconnected (its machine or its launcher died); the other machines stop, since no round can start without it");
  }

  void start_round(int number) {
    round_ = number;
    failed_ = false;
    interrupted_ = false;
    fail_code_ = 0;
    failure_.clear();
    for (auto& p : peers_) p.ended = false;
    broadcast("START " + std::to_string(round_) + " " + std::to_string(port_));
  }

  void finish_round() {
    if (!failed_) return end_run(0, "");
    const int code = fail_code_ != 0 ? fail_code_ : 1;
    if (interrupted_) return end_run(code, "stopped by a signal to a launcher (" + failure_ + ")");
    if (restarts_ >= s_.max_restarts)
      return end_run(code, "giving up after " + std::to_string(s_.max_restarts) + " restart" +
                               (s_.max_restarts == 1 ? "" : "s") + " (last failure: " + failure_ + ")");
    ++restarts_;
    // The last round's store may linger on its port.
    if (!detail::port_is_free(port_)) {
      const int fresh = detail::pick_free_port(/*loopback_only=*/false);
      if (fresh != 0) port_ = fresh;
    }
    start_round(round_ + 1);
  }

  void end_run(int code, const std::string& why) {
    broadcast("EXIT " + std::to_string(code) + " " + why);
    over_ = true;
  }

  MachineAgents::Settings s_;
  int listen_fd_ = -1;
  std::thread thread_;
  std::atomic<bool> quit_{false};
  std::vector<Peer> peers_;
  int round_ = -1;
  int port_ = 0;
  int restarts_ = 0;
  bool failed_ = false, interrupted_ = false, over_ = false;
  int fail_code_ = 0;
  std::string failure_;
  std::string bind_host_;
  int refusals_ = 0;
};

int connect_to(const std::string& host, int port, double timeout_s) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  std::string last_error = "no attempt";
  while (true) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
    if (gai != 0) {
      last_error = ::gai_strerror(gai);
    } else {
      for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          ::freeaddrinfo(found);
          const int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          return fd;
        }
        last_error = std::strerror(errno);
        ::close(fd);
      }
      ::freeaddrinfo(found);
    }
    if (Clock::now() > deadline)
      throw Error("hasten launch: cannot reach machine 0's launcher at " + host + ":" + std::to_string(port) +
                  " (main_process_port + 1) within rendezvous_timeout_s (" + std::to_string(static_cast<int>(timeout_s)) +
                  " s): " + last_error);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace

struct MachineAgents::Impl {
  std::unique_ptr<Coordinator> coordinator;  // machine 0 only
  int machine = 0;
  int fd = -1;
  std::string buf;
  std::deque<std::string> lines;
  bool closed = false;
  int round = -1;
  bool stop = false;
  std::string stop_reason;

  // Reads what has arrived; with wait, blocks (in short polls) until something does.
  void pump(bool wait) {
    if (closed) return;
    do {
      pollfd p{fd, POLLIN, 0};
      const int ready = ::poll(&p, 1, wait ? 200 : 0);
      if (ready > 0) {
        if (!read_lines(fd, buf, lines)) closed = true;
        return;
      }
    } while (wait);
  }
};

MachineAgents::MachineAgents(const Settings& s) : impl_(std::make_unique<Impl>()) {
  impl_->machine = s.machine_rank;
  if (s.machine_rank == 0) impl_->coordinator = std::make_unique<Coordinator>(s);
  impl_->fd = connect_to(s.machine_rank == 0 ? impl_->coordinator->local_address() : s.main_addr, s.agent_port,
                         s.join_timeout_s);
  if (!send_line(impl_->fd, "JOIN " + std::to_string(s.machine_rank) + (s.token.empty() ? "" : " " + s.token)))
    throw Error("hasten launch: machine 0's launcher closed the connection while this machine joined");
}

MachineAgents::~MachineAgents() {
  if (impl_->fd >= 0) ::close(impl_->fd);
}

MachineAgents::Round MachineAgents::next_round() {
  Impl& m = *impl_;
  for (;;) {
    while (!m.lines.empty()) {
      const std::string line = m.lines.front();
      m.lines.pop_front();
      const auto f = split_fields(line, 2);
      if (f[0] == "START" && f.size() >= 3) {
        m.round = to_int(f[1], 0);
        m.stop = false;
        m.stop_reason.clear();
        return Round{true, m.round, to_int(f[2], 0), 0, ""};
      }
      if (f[0] == "EXIT") {
        const auto g = split_fields(line, 2);
        return Round{false, m.round, 0, to_int(g.size() > 1 ? g[1] : "1", 1),
                     detail::printable(g.size() > 2 ? g[2] : "", 2000)};
      }
      // A STOP of a round already over: nothing left to stop.
    }
    if (m.closed)
      return Round{false, m.round, 0, 1, "lost the connection to machine 0's launcher (it died or was stopped)"};
    m.pump(/*wait=*/true);
  }
}

bool MachineAgents::stop_requested() {
  Impl& m = *impl_;
  if (m.stop) return true;
  m.pump(/*wait=*/false);
  for (auto it = m.lines.begin(); it != m.lines.end();) {
    const auto f = split_fields(*it, 3);
    if (f[0] == "STOP" && f.size() >= 4 && to_int(f[1]) == m.round) {
      // This machine's own failure: its supervisor is already stopping the workers.
      if (to_int(f[2]) != m.machine) {
        m.stop = true;
        m.stop_reason = "machine " + detail::printable(f[2], 20) + ": " + detail::printable(f[3], 2000);
      }
      it = m.lines.erase(it);
    } else if (f[0] == "EXIT") {  // kept for next_round, which reports it
      if (!m.stop) {
        m.stop = true;
        m.stop_reason = detail::printable(split_fields(*it, 2).back(), 2000);
      }
      ++it;
    } else {
      ++it;
    }
  }
  if (!m.stop && m.closed) {
    m.stop = true;
    m.stop_reason = "lost the connection to machine 0's launcher";
  }
  return m.stop;
}

std::string MachineAgents::stop_reason() const { return impl_->stop_reason; }

void MachineAgents::report_failure(int rank, const std::string& what) {
  std::string one_line = what;
  for (auto& c : one_line)
    if (c == '\n') c = ' ';
  send_line(impl_->fd, "FAIL " + std::to_string(impl_->round) + " " + std::to_string(rank) + " " + one_line);
}

void MachineAgents::report_end(int code, bool interrupted) {
  send_line(impl_->fd, "END " + std::to_string(impl_->round) + " " + std::to_string(code) + " " + (interrupted ? "1" : "0"));
}

}  // namespace hasten::cli
