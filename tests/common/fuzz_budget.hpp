// The fuzz tests' seed and budget. In `make test` each runs a fixed number of cases from a
// fixed seed (deterministic, seconds); scripts/fuzz.sh (`make fuzz`) sets
// HASTEN_TEST_FUZZ_SEED and HASTEN_TEST_FUZZ_SECONDS to run on, from another seed, until the
// time is spent.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace hasten::test {

class FuzzBudget {
 public:
  explicit FuzzBudget(uint64_t default_seed, int default_cases) : cases_(default_cases) {
    seed_ = default_seed;
    if (const char* s = std::getenv("HASTEN_TEST_FUZZ_SEED")) seed_ = std::strtoull(s, nullptr, 10);
    if (const char* t = std::getenv("HASTEN_TEST_FUZZ_SECONDS")) seconds_ = std::strtod(t, nullptr);
    start_ = std::chrono::steady_clock::now();
  }
  uint64_t seed() const { return seed_; }
  // Whether case `i` (counted from 0) is still to run.
  bool more(int i) const {
    if (seconds_ <= 0) return i < cases_;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count() < seconds_;
  }

 private:
  uint64_t seed_;
  int cases_;
  double seconds_ = 0;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace hasten::test
