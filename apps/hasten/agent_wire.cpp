// The launchers' wire (agent_wire.hpp).
#include "agent_wire.hpp"

#include <sys/socket.h>

#include <cerrno>

namespace hasten::cli::wire {

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

int to_int(const std::string& s, int fallback) {
  try {
    size_t used = 0;
    const int v = std::stoi(s, &used);
    return used == s.size() ? v : fallback;
  } catch (const std::exception&) {
    return fallback;
  }
}

}  // namespace hasten::cli::wire
