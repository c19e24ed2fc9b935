// Arrays of ABI structs that a plugin hands the host (its presets, its options). The plugin
// laid them out with its own sizeof of the element, which every element states in its
// struct_size: element i is at i x the struct_size of element 0, never at the host's sizeof (a
// plugin built against another minor has shorter or longer elements). Each element is copied
// into zeroed host storage, so the fields its minor did not have read as 0/NULL (plugin.h's
// rules). No LibTorch here.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace hasten::detail {

// The largest element stride the host accepts (far above any struct of the ABI).
inline constexpr uint32_t kMaxAbiStride = 1u << 16;

// Copies element `index` of `array` into *out. false, with *why saying what is wrong, when
// element 0's struct_size cannot be a stride or element `index` declares another size.
template <class T>
bool abi_element(const T* array, uint32_t index, T* out, std::string* why) {
  static_assert(std::is_trivially_copyable_v<T>, "ABI structs are plain C structs");
  const auto* base = reinterpret_cast<const unsigned char*>(array);
  uint32_t stride = 0;
  std::memcpy(&stride, base, sizeof stride);  // struct_size leads every ABI struct
  if (stride < 2 * sizeof(uint32_t) || stride > kMaxAbiStride) {
    *why = "declares struct_size " + std::to_string(stride) + " for its elements (not a struct's size)";
    return false;
  }
  const unsigned char* at = base + static_cast<size_t>(index) * stride;
  uint32_t own = 0;
  std::memcpy(&own, at, sizeof own);
  if (own != stride) {
    *why = "element " + std::to_string(index) + " declares struct_size " + std::to_string(own) + ", element 0 " +
           std::to_string(stride) + " (the elements of one array share the plugin's sizeof)";
    return false;
  }
  *out = T{};
  std::memcpy(out, at, std::min<size_t>(stride, sizeof(T)));
  return true;
}

}  // namespace hasten::detail
