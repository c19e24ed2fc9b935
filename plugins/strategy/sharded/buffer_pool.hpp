// A cache of the flat buffers units gather their parameters into and produce their full
// gradients in. Stage 3 materialises a unit before its forward and again before its backward,
// and stages 2-3 allocate a unit's full gradients for each backward: freeing those buffers
// returns them to the kernel (large allocations are mmap'd), and the next allocation faults
// every page in again, zero-filled by the kernel. On a CPU that is the largest cost of
// sharding (a 64 MiB unit is 16,384 page faults per materialisation). The pool keeps buffers
// the strategy gives back and hands them out again for a request of the same size.
//
// Bounded so that it never raises the peak: the buffers it holds idle plus those in use never
// exceed the most that were in use at once (a fresh allocation first gives idle buffers back
// to the allocator, oldest first, until it fits under that high-water mark). Between steps it
// holds at most one step's working set (in stage 3, the parameters and gradients of the units
// around the largest one); what a process peaks at is what it would without the pool.
// Only buffers of at least kMinBytes are pooled: smaller ones come from the allocator's own
// free lists without page faults. CPU buffers only: CUDA's caching allocator already keeps
// freed blocks.
#pragma once

#include <c10/core/Allocator.h>

#include <cstddef>
#include <deque>

namespace hasten::sharded {

class BufferPool {
 public:
  static constexpr size_t kMinBytes = 1 << 20;

  // A buffer of exactly `nbytes` from the pool, else a fresh one from `allocator`.
  c10::DataPtr take(c10::Allocator* allocator, size_t nbytes);
  // Returns a buffer take() gave out (of `nbytes`), for a later take.
  void give(c10::DataPtr buffer, size_t nbytes);
  size_t idle_bytes() const { return idle_; }
  // take() calls that had to allocate (buffers of at least kMinBytes): each is fresh pages.
  size_t fresh() const { return fresh_; }

 private:
  struct Entry {
    c10::DataPtr buffer;
    size_t nbytes;
  };
  void trim();  // idle buffers back to the allocator, oldest first, down to the mark

  std::deque<Entry> entries_;  // idle buffers, oldest first
  size_t idle_ = 0, in_use_ = 0, high_water_ = 0, fresh_ = 0;
};

}  // namespace hasten::sharded
