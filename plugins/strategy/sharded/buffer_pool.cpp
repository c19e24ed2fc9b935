#include "buffer_pool.hpp"

#include <algorithm>
#include <iterator>
#include <utility>

namespace hasten::sharded {

c10::DataPtr BufferPool::take(c10::Allocator* allocator, size_t nbytes) {
  if (nbytes < kMinBytes) return allocator->allocate(nbytes);
  in_use_ += nbytes;
  high_water_ = std::max(high_water_, in_use_);
  // The newest idle buffer of that size: its pages are the likeliest to be warm in cache.
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it)
    if (it->nbytes == nbytes) {
      c10::DataPtr out = std::move(it->buffer);
      idle_ -= nbytes;
      entries_.erase(std::next(it).base());
      return out;
    }
  // A fresh buffer: first give idle ones back so that idle + in use stays under the mark.
  trim();
  ++fresh_;
  return allocator->allocate(nbytes);
}

void BufferPool::trim() {
  while (!entries_.empty() && idle_ + in_use_ > high_water_) {
    idle_ -= entries_.front().nbytes;
    entries_.pop_front();  // the DataPtr's deleter returns the memory
  }
}

void BufferPool::give(c10::DataPtr buffer, size_t nbytes) {
  if (nbytes < kMinBytes) return;  // freed here, as it was allocated
  in_use_ -= std::min(in_use_, nbytes);
  if (buffer.get() == nullptr) return;
  entries_.push_back({std::move(buffer), nbytes});
  idle_ += nbytes;
  trim();  // a buffer that did not come from take() (made at prepare) is not kept
}

}  // namespace hasten::sharded
