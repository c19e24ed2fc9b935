// A cache of the flat buffers units gather their parameters into and produce their full
// gradients in. Stage 3 materialises a unit before its forward and again before its backward,
// and stages 2-3 allocate a unit's full gradients for each backward: freeing those buffers
// returns them to the kernel (large allocations are mmap'd), and the next allocation faults
// every page in again, zero-filled by the kernel. On a CPU that is the largest cost of
// sharding (a 64 MiB unit is 16,384 page faults per materialisation). The pool keeps buffers
// the strategy gives back and hands them out again for a request of the same size.
//
// Bounded per size: of each buffer size it holds, idle and in use together, no more buffers
// than were ever in use at once, so every step after the first finds what it needs and
// faults nothing in. (An earlier bound on the bytes of all sizes together, the most ever in
// use at once, made it evict the small units' buffers whenever the largest unit's parameters
// and gradients filled that mark, and fault them in again every step: 8 fresh buffers a step
// on mlp-large.) With units of one size (a transformer's layers) the bound is the step's
// peak working set; with units of several sizes the idle buffers of the other sizes add to
// the peak resident memory (docs/benchmarks.md measures it on mlp-large). Only buffers of at
// least kMinBytes are pooled: smaller ones come from the allocator's own free lists without
// page faults. CPU buffers only: CUDA's caching allocator already keeps freed blocks.
#pragma once

#include <c10/core/Allocator.h>

#include <cstddef>
#include <map>
#include <vector>

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
  struct Size {
    std::vector<c10::DataPtr> idle;  // newest last: its pages are the likeliest to be warm in cache
    size_t in_use = 0, most_in_use = 0;
  };
  std::map<size_t, Size> sizes_;
  size_t idle_ = 0, fresh_ = 0;
};

}  // namespace hasten::sharded
