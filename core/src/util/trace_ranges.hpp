// Named ranges in a profile from code with or without LibTorch: the comm layer (LibTorch-free)
// and the engine mark hasten's phases with a TraceRange. libhasten's LibTorch half
// (engine/profiling.cpp) installs the two functions that open and close LibTorch's user-scope
// ranges when it loads; without them (the leaf tests) a range costs one atomic load.
#pragma once

namespace hasten::detail {

using RangeBegin = void* (*)(const char* name);  // returns a handle for RangeEnd (may be null)
using RangeEnd = void (*)(void* handle);

// Installs (or, with nulls, removes) the range functions. Ranges already open keep the
// functions they were opened with.
void set_trace_ranges(RangeBegin begin, RangeEnd end) noexcept;

// A range for the lifetime of the object, on the thread that made it. `name` must outlive it
// (a string literal).
class TraceRange {
 public:
  explicit TraceRange(const char* name) noexcept;
  ~TraceRange();
  TraceRange(const TraceRange&) = delete;
  TraceRange& operator=(const TraceRange&) = delete;

 private:
  RangeEnd end_ = nullptr;
  void* handle_ = nullptr;
};

}  // namespace hasten::detail
