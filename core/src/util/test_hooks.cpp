#include "util/test_hooks.hpp"

#if defined(HASTEN_TEST_HOOKS) && HASTEN_TEST_HOOKS

#include <hasten/error.hpp>

#include <csignal>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

namespace hasten::detail {

namespace {

// Whether `spec` (POINT[:N]) names point at its count-th arrival.
bool matches(const char* spec, const std::string& point, int count) {
  if (spec == nullptr) return false;
  const std::string s = spec;
  const auto colon = s.find(':');
  if (s.substr(0, colon) != point) return false;
  return count == (colon == std::string::npos ? 1 : std::atoi(s.c_str() + colon + 1));
}

}  // namespace

void test_point(const char* point, int rank) {
  static std::mutex mutex;
  static std::map<std::string, int> arrivals;
  int count = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    count = ++arrivals[point];
  }
  const char* r = std::getenv("HASTEN_TEST_CRASH_RANK");
  if (rank != (r != nullptr ? std::atoi(r) : 0)) return;
  if (matches(std::getenv("HASTEN_TEST_CRASH_AT"), point, count)) ::raise(SIGKILL);
  if (matches(std::getenv("HASTEN_TEST_FAIL_AT"), point, count))
    throw Error(std::string("injected failure at ") + point);
}

bool test_forbids(const char* what) {
  const char* v = std::getenv((std::string("HASTEN_TEST_NO_") + what).c_str());
  return v != nullptr && std::string(v) == "1";
}

}  // namespace hasten::detail

#endif
