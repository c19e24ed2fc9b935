#include "util/text_util.hpp"

#include <cstdio>

#include <algorithm>
#include <cctype>

namespace hasten::detail {

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

namespace {
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t sub = prev[j - 1] + (std::tolower(a[i - 1]) == std::tolower(b[j - 1]) ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}
}  // namespace

std::string nearest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::max<size_t>(1, word.size() / 3) + 1;
  for (auto& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

std::string to_lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::string seconds_text(int64_t ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(ms) / 1000.0);
  return buf;
}

std::string untrusted_text(const char* s, size_t limit) {
  std::string out;
  if (s == nullptr) return out;
  size_t n = 0;
  for (; s[n] != '\0' && n < limit; ++n) {
    const auto c = static_cast<unsigned char>(s[n]);
    out.push_back(c < 0x20 || c >= 0x7f ? '?' : static_cast<char>(c));
  }
  if (s[n] != '\0') out += "...";
  return out;
}

}  // namespace hasten::detail
