// Machine 0's coordinator (machine_coordinator.hpp; the protocol in machine_agents.hpp).
#include "machine_coordinator.hpp"

#include <hasten/detail/launch_contract.hpp>
#include <hasten/error.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <iostream>
#include <thread>
#include <vector>

#include "agent_wire.hpp"

namespace hasten::cli {

using namespace wire;

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

// The peers (launchers) and the round they are in; everything runs on the coordinator's thread.
class MachineCoordinator::Impl {
 public:
  explicit Impl(const MachineAgents::Settings& s) : s_(s), port_(s.master_port) {
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

  ~Impl() {
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
    Clock::time_point heard;    // its last line (launchers PING every kPingEvery)
    std::string buf;
    bool member = false;  // takes part in the current round
    bool ended = false;
  };

  // A JOIN must come this soon after connecting.
  static constexpr std::chrono::seconds kJoinWithin{10};
  // Elastic: how long the first round waits for the machines beyond the minimum once they have
  // joined (torchrun's last call).
  static constexpr std::chrono::seconds kLastCall{10};
  bool elastic() const { return s_.min_machines > 0 && s_.min_machines < s_.num_machines; }
  int alive() const {
    int count = 0;
    for (auto& p : peers_) count += p.machine >= 0 && p.fd >= 0;
    return count;
  }
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
          peer.heard = Clock::now();
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
        if (!lines.empty()) p.heard = Clock::now();
        if (!open && p.buf.size() > kMaxLine)
          refuse_line("closed the connection from " + p.address + ": it sent a line longer than " +
                      std::to_string(kMaxLine) + " bytes");
        for (auto& line : lines)
          if (!over_) handle(p, line);
        if (!open && !over_) gone(p);
      }
      for (auto& p : peers_)
        if (!over_ && p.fd >= 0 && p.machine >= 0 && Clock::now() - p.heard > kSilentFor)
          gone(p, "went silent (no word for " + std::to_string(kSilentFor.count()) +
                      " s: its machine is unreachable, or its launcher stopped)");
      // Peers refused or gone are dropped (their sockets closed).
      for (auto it = peers_.begin(); it != peers_.end();)
        if (it->fd < 0) it = peers_.erase(it);
        else ++it;
      if (deciding_ && !over_) {
        deciding_ = false;
        finish_round();
      }
      if (round_ < 0 && !over_ && elastic() && alive() >= s_.min_machines && Clock::now() - min_reached_ >= kLastCall)
        start_round(0);
      if (round_ < 0 && !over_ && Clock::now() > join_deadline && elastic() && alive() >= s_.min_machines)
        start_round(0);  // the minimum joined, the last call not yet over: the deadline ends the wait
      if (round_ < 0 && !over_ && Clock::now() > join_deadline) {
        std::string missing;
        for (int m = 0; m < s_.num_machines; ++m)
          if (!joined(m)) missing += (missing.empty() ? "" : ", ") + std::to_string(m);
        end_run(1, "machine" + std::string(missing.find(',') == std::string::npos ? " " : "s ") + missing +
                       " did not join within rendezvous_timeout_s (" + std::to_string(static_cast<int>(s_.join_timeout_s)) +
                       " s" + (elastic() ? ", and fewer than the minimum " + std::to_string(s_.min_machines) + " did" : "") +
                       "); start `hasten launch` on every machine with the same num_machines, main_process_ip and "
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
      else if (round_ >= 0 && !elastic())
        refusal = "the run has already started";
      else if (round_ >= 0 && restarts_ >= s_.max_restarts)
        refusal = "the run has no restart left to take this machine in (max_restarts " + std::to_string(s_.max_restarts) + ")";
      if (!refusal.empty()) {
        send_line(p.fd, "EXIT 1 " + refusal);
        ::close(p.fd);
        p.fd = -1;
        return;
      }
      p.machine = m;
      if (round_ >= 0) {  // elastic, during the run: the next round takes this machine in
        change("machine " + std::to_string(m) + " joined");
        return;
      }
      const int count = alive();
      if (count == s_.num_machines) start_round(0);
      else if (count == s_.min_machines) min_reached_ = Clock::now();
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
      maybe_finish();
    }
  }

  // Elastic: the round in progress stops (every member: STOP names machine -1), and the next
  // starts with the machines present then.
  void change(const std::string& what) {
    changed_ += (changed_.empty() ? "" : "; ") + what;
    if (!failed_) failure_ = what;
    failed_ = true;
    if (!deciding_) broadcast("STOP " + std::to_string(round_) + " -1 " + what);
    maybe_finish();
  }

  // Once every member of the round has ended (or left), the next round or the end is decided
  // (in run(), after this pass's lines: a departure read in the same pass counts).
  void maybe_finish() {
    if (deciding_ || round_ < 0) return;
    for (auto& q : peers_)
      if (q.member && q.fd >= 0 && !q.ended) return;
    deciding_ = true;
  }

  void gone(Peer& p, const std::string& how = "disconnected (its machine or its launcher died)") {
    const int m = p.machine;
    const bool member = p.member;
    ::close(p.fd);
    p.fd = -1;
    if (m < 0) return;
    if (!elastic())
      return end_run(1, "the launcher of machine " + std::to_string(m) + " " + how +
                            "; the other machines stop, since no round can start without it");
    if (round_ < 0) return;  // before the first round: it may yet join again
    if (alive() < s_.min_machines) {
      if (!deciding_) broadcast("STOP " + std::to_string(round_) + " -1 machine " + std::to_string(m) + " left");
      return end_run(1, "the launcher of machine " + std::to_string(m) + " " + how + ", and " + std::to_string(alive()) +
                            (alive() == 1 ? " machine remains" : " machines remain") + ", fewer than the minimum " +
                            std::to_string(s_.min_machines) + " (num_machines " + std::to_string(s_.min_machines) + ":" +
                            std::to_string(s_.num_machines) + ")");
    }
    if (member) change("machine " + std::to_string(m) + " left (its launcher " + how + ")");
  }

  // The machines present take part, numbered by machine_rank; each learns its place.
  void start_round(int number) {
    round_ = number;
    failed_ = false;
    interrupted_ = false;
    fail_code_ = 0;
    failure_.clear();
    changed_.clear();
    std::vector<Peer*> members;
    for (auto& p : peers_) {
      p.member = p.machine >= 0 && p.fd >= 0;
      p.ended = false;
      if (p.member) members.push_back(&p);
    }
    std::sort(members.begin(), members.end(), [](const Peer* a, const Peer* b) { return a->machine < b->machine; });
    for (size_t i = 0; i < members.size(); ++i)
      send_line(members[i]->fd, "START " + std::to_string(round_) + " " + std::to_string(port_) + " " +
                                    std::to_string(members.size()) + " " + std::to_string(i));
  }

  void finish_round() {
    if (!failed_) return end_run(0, "");
    const int code = fail_code_ != 0 ? fail_code_ : 1;
    if (interrupted_) return end_run(code, "stopped by a signal to a launcher (" + failure_ + ")");
    if (restarts_ >= s_.max_restarts)
      return end_run(code, "giving up after " + std::to_string(s_.max_restarts) + " restart" +
                               (s_.max_restarts == 1 ? "" : "s") + " (" +
                               (changed_.empty() ? "last failure: " + failure_ : changed_) + ")");
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
  bool deciding_ = false;          // every member ended: next round or end, at the end of the pass
  Clock::time_point min_reached_{};  // elastic: when the minimum had joined (the last call's start)
  std::string changed_;             // elastic: the machines that left or joined during this round
  int fail_code_ = 0;
  std::string failure_;
  std::string bind_host_;
  int refusals_ = 0;
};

MachineCoordinator::MachineCoordinator(const MachineAgents::Settings& settings)
    : impl_(std::make_unique<Impl>(settings)) {}

MachineCoordinator::~MachineCoordinator() = default;

std::string MachineCoordinator::local_address() const { return impl_->local_address(); }

}  // namespace hasten::cli
