// CLI11 checks shared by hasten's programs for numeric flags. CLI11's PositiveNumber and
// NonNegativeNumber let "nan" through (every comparison with NaN is false), and a value out
// of what a program can use must be refused, not replaced by a default or left to fail later.
#pragma once

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>

namespace hasten::cli {

// A finite number in [lo, hi]; the message names the value and the allowed range.
inline CLI::Validator finite_in(double lo, double hi) {
  auto show = [](double d) {
    std::ostringstream o;
    o << d;
    return o.str();
  };
  const std::string allowed = "a finite number from " + show(lo) + " to " + show(hi);
  return CLI::Validator(
      [lo, hi, allowed](std::string& text) -> std::string {
        char* end = nullptr;
        const double d = std::strtod(text.c_str(), &end);
        if (text.empty() || end == nullptr || *end != '\0' || !std::isfinite(d) || d < lo || d > hi)
          return "value '" + text + "' is not allowed (allowed: " + allowed + ")";
        return "";
      },
      allowed);
}

// An integer in [lo, hi] (CLI11's Range names the value and the range; this one says so in
// the same words as finite_in).
inline CLI::Validator integer_in(long long lo, long long hi) {
  const std::string allowed = "an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
  return CLI::Validator(
      [lo, hi, allowed](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || end == nullptr || *end != '\0' || errno != 0 || v < lo || v > hi)
          return "value '" + text + "' is not allowed (allowed: " + allowed + ")";
        return "";
      },
      allowed);
}

}  // namespace hasten::cli
