// Accelerate's memory helpers (accelerate.utils.memory): find_executable_batch_size retries a
// training function with half the batch after each out-of-memory error, and release_memory
// drops handles and returns what the device caches hold.
//
//   const int64_t used = hasten::find_executable_batch_size([&](int64_t batch_size) {
//     hasten::Accelerator acc;  // one per attempt: a failed attempt's model and state go with it
//     ...train with batch_size...
//     return batch_size;
//   }, 128);
#pragma once

#include <hasten/error.hpp>

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace hasten {

namespace detail {
// An out-of-memory error: LibTorch's c10::OutOfMemoryError (its CPU allocator's and CUDA's
// caching allocator's), std::bad_alloc, or an error whose message is one of those Accelerate's
// should_reduce_batch_size recognises (CUDA out of memory, cuDNN's CUDNN_STATUS_NOT_SUPPORTED,
// DefaultCPUAllocator: can't allocate memory), also when hasten wrapped it in its own error.
bool is_out_of_memory(const std::exception& e) noexcept;
// Returns to the device what LibTorch's caching allocator holds unused (CUDA, where a device
// is present); nothing on a CPU-only run.
void empty_device_caches();
void log_batch_size_retry(int64_t failed, int64_t next, const std::exception& e);
}  // namespace detail

// Calls fn(batch_size) with starting_batch_size, then with half of it after each
// out-of-memory error (detail::is_out_of_memory: CPU and CUDA alike), emptying the device
// caches in between, and returns what the first call that completes returns. Any other error
// goes through unchanged. Throws hasten::Error when the batch size reaches zero, and
// UsageError for a starting_batch_size below 1. Each process searches on its own, as
// Accelerate's does: under several processes an out-of-memory error must happen on every rank
// alike (the same model and batch size everywhere), or the ranks' batch sizes part ways.
template <class Fn>
auto find_executable_batch_size(Fn&& fn, int64_t starting_batch_size = 128) -> std::invoke_result_t<Fn&, int64_t> {
  if (starting_batch_size < 1)
    throw UsageError("find_executable_batch_size: starting_batch_size must be at least 1, got " +
                     std::to_string(starting_batch_size));
  for (int64_t batch_size = starting_batch_size;; batch_size /= 2) {
    if (batch_size == 0)
      throw Error("find_executable_batch_size: no batch size fits in memory: every one from " +
                  std::to_string(starting_batch_size) + " down to 1 ran out of memory");
    try {
      return fn(batch_size);
    } catch (const std::exception& e) {
      if (!detail::is_out_of_memory(e)) throw;
      detail::log_batch_size_retry(batch_size, batch_size / 2, e);
    }
    detail::empty_device_caches();
  }
}

namespace detail {
template <class T>
struct is_vector : std::false_type {};
template <class T, class A>
struct is_vector<std::vector<T, A>> : std::true_type {};
template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};

template <class T>
void release_one(T& object) {
  if constexpr (is_vector<T>::value) {
    object.clear();
    object.shrink_to_fit();
  } else if constexpr (is_optional<T>::value) {
    object.reset();
  } else if constexpr (std::is_assignable_v<T&, std::nullptr_t>) {
    object = nullptr;  // std::shared_ptr, std::unique_ptr, a LibTorch module holder (TORCH_MODULE)
  } else {
    static_assert(std::is_default_constructible_v<T> && std::is_move_assignable_v<T>,
                  "release_memory: pass tensors, smart pointers, module holders, vectors or optionals");
    object = T();  // a tensor: undefined, its storage released with its last reference
  }
}
}  // namespace detail

// Accelerate's release_memory(*objects): resets each handle (a tensor becomes undefined, a
// pointer or module holder null, a vector or optional empty), then empties the device caches.
// The memory goes once nothing else refers to it: a model or optimizer prepared by an
// Accelerator is also held by that Accelerator until it is destroyed.
template <class... T>
void release_memory(T&... objects) {
  (detail::release_one(objects), ...);
  detail::empty_device_caches();
}

}  // namespace hasten
