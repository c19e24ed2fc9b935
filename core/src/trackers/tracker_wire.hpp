// The framed messages between the training process and a tracker host process
// (hasten-tracker-host, tracker_host.cpp), over one AF_UNIX stream socket:
//   uint32 length of what follows | uint8 message type | fields
// Fields are int32/int64/double in the machine's byte order (both ends are the same build
// on the same machine) and strings as uint32 length + bytes. One frame per call, so a log
// call costs one send() on the training side.
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace hasten::detail::wire {

// The host's end of the socket, set up by the spawning process.
constexpr int kHostFd = 3;
// Frames larger than this are refused by the reader (a broken peer, not a log call).
constexpr uint32_t kMaxFrame = 256u << 20;

enum class Msg : uint8_t {
  // training process -> host
  Create = 1,   // file, name, options_json, log_level, program, rank, world_size, local_rank,
                // local_world_size, node_rank, num_nodes
  Start = 2,    // project, logging_dir, hparams_json, rank
  Scalars = 3,  // step, n, n x (name, value)
  Text = 4,     // step, name, text
  Finish = 5,   // status: flush, finish(status), reply Finished, destroy, exit
  Image = 6,      // step, name, height, width, channels, pixels (a string of bytes)
  Histogram = 7,  // step, name, values (a string of doubles)
  Table = 8,      // step, name, table_json
  RunInfo = 9,    // (none): reply Info
  // End of stream (the training process closed its end or died): destroy without finish,
  // which trackers record as a run that did not end well, and exit.
  // host -> training process
  Created = 10,   // create() succeeded; keeps (i32: the kKeeps* bits of the tracker's slots)
  Started = 11,   // start() succeeded
  Failed = 12,    // stage, message: the tracker returned an error (or threw); the host exits
  Finished = 13,  // finish() returned; destroy follows
  Info = 15,      // run_info's JSON text
  Crashed = 14,   // stage: written by the host's signal handler before it dies of the signal
};

class Writer {
 public:
  explicit Writer(Msg type) { buf_.resize(4), buf_.push_back(static_cast<char>(type)); }
  Writer& i32(int32_t v) { return raw(&v, sizeof v); }
  Writer& i64(int64_t v) { return raw(&v, sizeof v); }
  Writer& f64(double v) { return raw(&v, sizeof v); }
  Writer& str(const std::string& s) { return str(s.data(), s.size()); }
  Writer& str(const char* s, size_t n) {
    const auto len = static_cast<uint32_t>(n);
    raw(&len, sizeof len);
    return raw(s, n);
  }
  // The whole frame, its length prefix filled in.
  const std::string& frame() {
    const auto len = static_cast<uint32_t>(buf_.size() - 4);
    std::memcpy(&buf_[0], &len, sizeof len);
    return buf_;
  }

 private:
  Writer& raw(const void* p, size_t n) {
    buf_.append(static_cast<const char*>(p), n);
    return *this;
  }
  std::string buf_;
};

// Reads the fields of one frame's body (type byte first); a short frame throws.
class Reader {
 public:
  explicit Reader(std::string body) : body_(std::move(body)) {}
  Msg type() { return static_cast<Msg>(take<uint8_t>()); }
  int32_t i32() { return take<int32_t>(); }
  int64_t i64() { return take<int64_t>(); }
  double f64() { return take<double>(); }
  size_t remaining() const { return body_.size() - pos_; }
  std::string str() {
    const auto n = take<uint32_t>();
    need(n);
    std::string s = body_.substr(pos_, n);
    pos_ += n;
    return s;
  }

 private:
  template <class T>
  T take() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, body_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  void need(size_t n) const {
    if (body_.size() - pos_ < n) throw std::runtime_error("tracker host message is truncated");
  }
  std::string body_;
  size_t pos_ = 0;
};

using Clock = std::chrono::steady_clock;
using Deadline = std::optional<Clock::time_point>;  // nullopt: wait as long as it takes

enum class Io { Done, Closed, Timeout };

// Waits until fd is ready for `events` or the deadline passes.
inline Io wait_ready(int fd, short events, const Deadline& deadline) {
  for (;;) {
    int ms = -1;
    if (deadline) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now()).count();
      if (left <= 0) return Io::Timeout;
      ms = static_cast<int>(std::min<long long>(left, INT_MAX));
    }
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, ms);
    if (r > 0) return Io::Done;  // readable, writable, or hung up: the call that follows says which
    if (r == 0) return Io::Timeout;
    if (errno != EINTR) return Io::Closed;
  }
}

inline Io read_exact(int fd, char* p, size_t n, const Deadline& deadline) {
  while (n > 0) {
    if (const Io w = wait_ready(fd, POLLIN, deadline); w != Io::Done) return w;
    const ssize_t got = ::recv(fd, p, n, MSG_DONTWAIT);
    if (got == 0) return Io::Closed;
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return Io::Closed;
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
  return Io::Done;
}

// One frame's body (type byte first).
inline Io read_frame(int fd, std::string& body, const Deadline& deadline) {
  uint32_t len = 0;
  if (const Io r = read_exact(fd, reinterpret_cast<char*>(&len), sizeof len, deadline); r != Io::Done) return r;
  if (len == 0 || len > kMaxFrame) return Io::Closed;
  body.resize(len);
  return read_exact(fd, &body[0], len, deadline);
}

// Sends all of data; never raises SIGPIPE (a dead peer is Closed).
inline Io send_all(int fd, const std::string& data, const Deadline& deadline) {
  const char* p = data.data();
  size_t n = data.size();
  while (n > 0) {
    const ssize_t sent = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (const Io w = wait_ready(fd, POLLOUT, deadline); w != Io::Done) return w;
        continue;
      }
      return Io::Closed;
    }
    p += sent;
    n -= static_cast<size_t>(sent);
  }
  return Io::Done;
}

}  // namespace hasten::detail::wire
