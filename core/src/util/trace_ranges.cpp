// The range functions the profiler installs (see trace_ranges.hpp).
#include "util/trace_ranges.hpp"

#include <atomic>
#include <mutex>

namespace hasten::detail {

namespace {

// Writers serialise on the mutex; readers take no lock. Installing stores `end` before `begin`
// and removing clears `begin` before `end`, so a reader that finds `begin` then finds the `end`
// that closes it (or none, and opens no range).
std::mutex g_mutex;
std::atomic<RangeBegin> g_begin{nullptr};
std::atomic<RangeEnd> g_end{nullptr};

}  // namespace

void set_trace_ranges(RangeBegin begin, RangeEnd end) noexcept {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (begin == nullptr || end == nullptr) {
    g_begin.store(nullptr, std::memory_order_release);
    g_end.store(nullptr, std::memory_order_release);
    return;
  }
  g_end.store(end, std::memory_order_release);
  g_begin.store(begin, std::memory_order_release);
}

TraceRange::TraceRange(const char* name) noexcept {
  const RangeBegin begin = g_begin.load(std::memory_order_acquire);
  if (begin == nullptr) return;
  end_ = g_end.load(std::memory_order_acquire);
  if (end_ == nullptr) return;
  try {
    handle_ = begin(name);
  } catch (...) {
    handle_ = nullptr;  // a profile without this range, never a failed operation
  }
}

TraceRange::~TraceRange() {
  if (end_ != nullptr && handle_ != nullptr) end_(handle_);
}

}  // namespace hasten::detail
