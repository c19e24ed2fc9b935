// Small string helpers for messages: joining lists and suggesting a near match.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hasten::detail {

std::string join(const std::vector<std::string>& items, const std::string& sep);

// The candidate closest to `word` by edit distance, if it is close enough to be a plausible
// typo (distance <= max(1, len/3)); "" otherwise.
std::string nearest(const std::string& word, const std::vector<std::string>& candidates);

std::string to_lower(std::string s);
// Milliseconds as seconds with one decimal ("3.0"), as deadlines are said in messages.
std::string seconds_text(int64_t ms);
std::string trim(const std::string& s);
// Text from an untrusted source (a damaged plugin file's strings), fit for one message line:
// its first `limit` bytes with control and non-ASCII bytes as '?', and "..." when cut; "" for
// NULL.
std::string untrusted_text(const char* s, size_t limit = 64);

}  // namespace hasten::detail
