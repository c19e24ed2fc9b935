// The launchers' wire (machine_agents.hpp): one text line per message over TCP, shared by
// machine 0's coordinator (machine_coordinator.cpp) and every launcher's side of it.
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <string>
#include <vector>

namespace hasten::cli::wire {

// The longest line a launcher sends (a FAIL with a worker's last words is the longest):
// a peer that sends more without a newline is not a launcher of this run.
constexpr size_t kMaxLine = 16384;

// Liveness: every launcher sends PING at least this often (also between its other lines), and
// the coordinator takes a launcher it has not heard from for kSilentFor as gone, as if its
// connection had closed (a machine that lost power or its network sends no FIN).
constexpr std::chrono::seconds kPingEvery{1};
constexpr std::chrono::seconds kSilentFor{10};

// Sends one line whole; false when the peer is gone.
bool send_line(int fd, std::string line);
// Reads what is there into buf and moves whole lines to out; false at EOF, on an error, or
// when a line grows past kMaxLine.
bool read_lines(int fd, std::string& buf, std::deque<std::string>& out);
// "WORD a b rest of the line" -> the first `fields` words, then the rest (which may hold spaces).
std::vector<std::string> split_fields(const std::string& line, size_t fields);
// The whole string as an int, else fallback.
int to_int(const std::string& s, int fallback = -1);

}  // namespace hasten::cli::wire
