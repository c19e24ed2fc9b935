// Every launcher's side of the rounds across machines (machine_agents.hpp): its connection to
// machine 0's coordinator (machine_coordinator.cpp), which machine 0's launcher also hosts.
#include "machine_agents.hpp"

#include <hasten/detail/launch_contract.hpp>
#include <hasten/error.hpp>

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <thread>

#include "agent_wire.hpp"
#include "machine_coordinator.hpp"

namespace hasten::cli {

using namespace wire;

namespace {

using Clock = std::chrono::steady_clock;

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
  std::unique_ptr<MachineCoordinator> coordinator;  // machine 0 only
  int machine = 0;
  int fd = -1;
  std::string buf;
  std::deque<std::string> lines;
  bool closed = false;
  int round = -1;
  bool stop = false;
  std::string stop_reason;

  Clock::time_point last_sent = Clock::now();

  bool send(const std::string& line) {
    last_sent = Clock::now();
    return send_line(fd, line);
  }

  // Reads what has arrived; with wait, blocks (in short polls) until something does. Says
  // PING when nothing was sent for kPingEvery: the coordinator's sign that this launcher lives.
  void pump(bool wait) {
    if (closed) return;
    do {
      if (Clock::now() - last_sent >= kPingEvery) send("PING");
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
  if (s.machine_rank == 0) impl_->coordinator = std::make_unique<MachineCoordinator>(s);
  impl_->fd = connect_to(s.machine_rank == 0 ? impl_->coordinator->local_address() : s.main_addr, s.agent_port,
                         s.join_timeout_s);
  if (!impl_->send("JOIN " + std::to_string(s.machine_rank) + (s.token.empty() ? "" : " " + s.token)))
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
      const auto f = split_fields(line, 4);  // START round port machines place
      if (f[0] == "START" && f.size() >= 5) {
        m.round = to_int(f[1], 0);
        m.stop = false;
        m.stop_reason.clear();
        return Round{true, m.round, to_int(f[2], 0), 0, "", to_int(f[3], 1), to_int(f[4], 0)};
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
      if (to_int(f[2]) != m.machine) {  // -1: the membership changed (elastic)
        m.stop = true;
        m.stop_reason = (f[2] == "-1" ? "" : "machine " + detail::printable(f[2], 20) + ": ") + detail::printable(f[3], 2000);
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
  impl_->send("FAIL " + std::to_string(impl_->round) + " " + std::to_string(rank) + " " + one_line);
}

void MachineAgents::report_end(int code, bool interrupted) {
  impl_->send("END " + std::to_string(impl_->round) + " " + std::to_string(code) + " " + (interrupted ? "1" : "0"));
}

}  // namespace hasten::cli
