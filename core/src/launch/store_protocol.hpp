// hasten's store protocol, version 1: what store_server.cpp and store_client.cpp say to each
// other over TCP. Every message is a frame: a little-endian u32 length, then that many bytes.
//
//   request: u8 op, u32 key length, key, payload (op's own)
//   answer:  u8 status, payload
//
// The first request on a connection must be kHello, with the protocol name as key and the
// run's token as payload; the server answers kRefused and closes on anything else. A frame
// longer than kMaxFrame, or a key longer than kMaxKey, ends the connection: the server's
// memory is bounded by what a client that is not part of the run can make it hold.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace hasten::detail::store_protocol {

inline constexpr const char* kName = "hasten-store/1";

enum Op : uint8_t {
  kHello = 1,  // payload: the run's token (may be empty where the run has none)
  kSet = 2,    // payload: the value
  kGet = 3,    // answer: kOk + value, or kMissing
  kAdd = 4,    // payload: i64 delta; answer: kOk + i64 sum. The value is kept as decimal text.
  kCheck = 5,  // answer: kOk + u8 (1: present)
  kWait = 6,   // payload: i64 milliseconds; answer: kOk + value once present, or kTimeout
};

enum Status : uint8_t {
  kOk = 0,
  kRefused = 1,  // payload: why, one line; the server closes the connection
  kMissing = 2,
  kTimeout = 3,
  kBadRequest = 4,  // payload: why, one line
};

inline constexpr uint32_t kMaxKey = 4096;
inline constexpr uint32_t kMaxFrame = 64u << 20;
// Before its hello is accepted, a connection may send no frame longer than this.
inline constexpr uint32_t kMaxHelloFrame = 4096;
// A connection must say hello within this; a silent one is closed.
inline constexpr int kHelloWithinMs = 10000;

inline void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline void put_i64(std::string& out, int64_t value) {
  const auto v = static_cast<uint64_t>(value);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}
inline int64_t get_i64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return static_cast<int64_t>(v);
}

// A whole request frame, length included.
inline std::string request(Op op, const std::string& key, const std::string& payload) {
  std::string body;
  body.push_back(static_cast<char>(op));
  put_u32(body, static_cast<uint32_t>(key.size()));
  body += key;
  body += payload;
  std::string frame;
  put_u32(frame, static_cast<uint32_t>(body.size()));
  return frame + body;
}

inline std::string answer(Status status, const std::string& payload) {
  std::string frame;
  put_u32(frame, static_cast<uint32_t>(payload.size() + 1));
  frame.push_back(static_cast<char>(status));
  return frame + payload;
}

}  // namespace hasten::detail::store_protocol
