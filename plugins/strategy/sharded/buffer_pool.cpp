#include "buffer_pool.hpp"

#include <algorithm>
#include <utility>

namespace hasten::sharded {

c10::DataPtr BufferPool::take(c10::Allocator* allocator, size_t nbytes) {
  if (nbytes < kMinBytes) return allocator->allocate(nbytes);
  Size& s = sizes_[nbytes];
  s.most_in_use = std::max(s.most_in_use, ++s.in_use);
  if (!s.idle.empty()) {
    c10::DataPtr out = std::move(s.idle.back());
    s.idle.pop_back();
    idle_ -= nbytes;
    return out;
  }
  ++fresh_;
  return allocator->allocate(nbytes);
}

void BufferPool::give(c10::DataPtr buffer, size_t nbytes) {
  if (nbytes < kMinBytes) return;  // freed here, as it was allocated
  Size& s = sizes_[nbytes];
  if (s.in_use > 0) --s.in_use;
  // A buffer that did not come from take() (made at prepare) is kept only within the bound.
  if (buffer.get() == nullptr || s.idle.size() + s.in_use >= s.most_in_use) return;
  s.idle.push_back(std::move(buffer));
  idle_ += nbytes;
}

}  // namespace hasten::sharded
