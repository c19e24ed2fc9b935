// Nested structures of tensors (Accelerate's recursively_apply): std::vector, std::array,
// std::pair, std::tuple, std::map and std::unordered_map of tensors or of such structures, in
// any depth. The Accelerator's collectives take them and return the same structure, each
// tensor replaced by the collective's result; split_between_processes splits the values of a
// map. Collectives visit the tensors in one order on every rank: containers in their order,
// map entries by key (unordered maps too), so every rank must pass the same structure.
#pragma once

#include <hasten/error.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>

#include <algorithm>
#include <array>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace hasten::detail {

// A container shape the collectives walk into (the leaves are checked separately, so that a
// wrong leaf gets a static_assert naming it rather than "no matching function").
template <class T>
struct is_nested : std::false_type {};
template <class T, class A>
struct is_nested<std::vector<T, A>> : std::true_type {};
template <class T, size_t N>
struct is_nested<std::array<T, N>> : std::true_type {};
template <class A, class B>
struct is_nested<std::pair<A, B>> : std::true_type {};
template <class... T>
struct is_nested<std::tuple<T...>> : std::true_type {};
template <class K, class V, class C, class A>
struct is_nested<std::map<K, V, C, A>> : std::true_type {};
template <class K, class V, class H, class E, class A>
struct is_nested<std::unordered_map<K, V, H, E, A>> : std::true_type {};
template <class T>
inline constexpr bool is_nested_v = is_nested<std::decay_t<T>>::value;

// Whether every leaf of T is a tensor.
template <class T>
struct has_tensor_leaves : std::is_same<T, at::Tensor> {};
template <class T, class A>
struct has_tensor_leaves<std::vector<T, A>> : has_tensor_leaves<T> {};
template <class T, size_t N>
struct has_tensor_leaves<std::array<T, N>> : has_tensor_leaves<T> {};
template <class A, class B>
struct has_tensor_leaves<std::pair<A, B>> : std::bool_constant<has_tensor_leaves<A>::value && has_tensor_leaves<B>::value> {};
template <class... T>
struct has_tensor_leaves<std::tuple<T...>> : std::bool_constant<(has_tensor_leaves<T>::value && ...)> {};
template <class K, class V, class C, class A>
struct has_tensor_leaves<std::map<K, V, C, A>> : has_tensor_leaves<V> {};
template <class K, class V, class H, class E, class A>
struct has_tensor_leaves<std::unordered_map<K, V, H, E, A>> : has_tensor_leaves<V> {};
template <class T>
inline constexpr bool has_tensor_leaves_v = has_tensor_leaves<std::decay_t<T>>::value;

template <class T>
struct is_unordered_map : std::false_type {};
template <class K, class V, class H, class E, class A>
struct is_unordered_map<std::unordered_map<K, V, H, E, A>> : std::true_type {};
template <class T>
struct is_ordered_map : std::false_type {};
template <class K, class V, class C, class A>
struct is_ordered_map<std::map<K, V, C, A>> : std::true_type {};
template <class T>
struct is_sequence : std::false_type {};
template <class T, class A>
struct is_sequence<std::vector<T, A>> : std::true_type {};
template <class T, size_t N>
struct is_sequence<std::array<T, N>> : std::true_type {};

// The same structure with fn(tensor) in place of every tensor, visited in the order above.
template <class T, class F>
T apply_to_tensors(const T& data, F& fn) {
  if constexpr (std::is_same_v<T, at::Tensor>) {
    return fn(data);
  } else if constexpr (is_unordered_map<T>::value) {
    std::vector<const typename T::value_type*> entries;
    for (const auto& entry : data) entries.push_back(&entry);
    std::sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
    T out;
    for (const auto* entry : entries) out.emplace(entry->first, apply_to_tensors(entry->second, fn));
    return out;
  } else if constexpr (is_ordered_map<T>::value) {
    T out;
    for (const auto& [k, v] : data) out.emplace_hint(out.end(), k, apply_to_tensors(v, fn));
    return out;
  } else if constexpr (is_sequence<T>::value) {
    T out = data;  // same length, every element replaced in order
    for (size_t i = 0; i < data.size(); ++i) out[i] = apply_to_tensors(data[i], fn);
    return out;
  } else {
    // pair, tuple: each member in order (a braced list is evaluated left to right).
    return std::apply([&fn](const auto&... x) { return T{apply_to_tensors(x, fn)...}; }, data);
  }
}

// apply_to_tensors for the Accelerator's collectives on structures, with their one-line
// compile error for a leaf that is not a tensor.
template <class T, class F>
T on_tensor_leaves(const T& data, F fn) {
  static_assert(has_tensor_leaves_v<T>,
                "gather/gather_for_metrics/reduce/broadcast/pad_across_processes on a structure: every leaf "
                "must be a torch::Tensor (use gather_object/broadcast_object_list for other values)");
  return apply_to_tensors(data, fn);
}

// split_between_processes: the share of `length` items that rank r of n takes (Accelerate's
// arithmetic: the first length % n ranks get one more), and the length every share has with
// apply_padding.
struct SplitRange {
  size_t begin = 0, count = 0, padded = 0;
};
inline SplitRange split_range(size_t length, int num_processes, int rank) {
  const size_t n = static_cast<size_t>(num_processes), r = static_cast<size_t>(rank);
  const size_t base = length / n, extra = length % n;
  return {r * base + std::min(r, extra), base + (r < extra ? 1 : 0), base + (extra > 0 ? 1 : 0)};
}

template <class T>
struct is_splittable_map : std::false_type {};
template <class K, class V, class C, class A>
struct is_splittable_map<std::map<K, V, C, A>> : std::true_type {};
template <class K, class V, class H, class E, class A>
struct is_splittable_map<std::unordered_map<K, V, H, E, A>> : std::true_type {};

template <class T>
struct is_std_vector : std::false_type {};
template <class T, class A>
struct is_std_vector<std::vector<T, A>> : std::true_type {};

inline size_t split_length(const at::Tensor& t) {
  if (!t.defined() || t.dim() == 0)
    throw UsageError("split_between_processes: a tensor is split along dim 0 and needs at least one dimension "
                     "(got " + std::string(t.defined() ? "a scalar" : "an undefined tensor") + ")");
  return static_cast<size_t>(t.size(0));
}
template <class T, class A>
size_t split_length(const std::vector<T, A>& v) {
  return v.size();
}

// Every value of a map must have the same length (nested maps: every leaf); the first found
// (by key) sets it.
template <class Map>
void collect_split_lengths(const Map& m, const std::string& prefix, std::vector<std::pair<std::string, size_t>>& out) {
  for (const auto& [k, v] : m) {
    std::string name = prefix;
    if constexpr (std::is_convertible_v<decltype(k), std::string>)
      name += (prefix.empty() ? "" : ".") + std::string(k);
    else if constexpr (std::is_arithmetic_v<std::decay_t<decltype(k)>>)
      name += (prefix.empty() ? "" : ".") + std::to_string(k);
    else
      name += (prefix.empty() ? "" : ".") + std::string("(key)");
    if constexpr (is_splittable_map<std::decay_t<decltype(v)>>::value)
      collect_split_lengths(v, name, out);
    else
      out.emplace_back(name, split_length(v));
  }
}
template <class Map>
size_t split_length_of_map(const Map& m) {
  std::vector<std::pair<std::string, size_t>> lengths;
  collect_split_lengths(m, "", lengths);
  std::sort(lengths.begin(), lengths.end());
  for (const auto& [name, n] : lengths)
    if (n != lengths.front().second)
      throw UsageError("split_between_processes: every value of the map must have the same length ('" +
                       lengths.front().first + "' has " + std::to_string(lengths.front().second) + ", '" + name +
                       "' has " + std::to_string(n) + ")");
  return lengths.empty() ? 0 : lengths.front().second;
}

template <class T, class A>
std::vector<T, A> split_take(const std::vector<T, A>& v, const SplitRange& s, bool apply_padding) {
  std::vector<T, A> out(v.begin() + static_cast<std::ptrdiff_t>(s.begin),
                        v.begin() + static_cast<std::ptrdiff_t>(s.begin + s.count));
  if (apply_padding && !v.empty())
    while (out.size() < s.padded) out.push_back(v.back());
  return out;
}
// A view of this rank's rows; with padding, the input's last row repeats (Accelerate pads
// with pad_across_processes(pad_index=inputs[-1])).
inline at::Tensor split_take(const at::Tensor& t, const SplitRange& s, bool apply_padding) {
  at::Tensor out = t.narrow(0, static_cast<int64_t>(s.begin), static_cast<int64_t>(s.count));
  if (!apply_padding || s.count >= s.padded || t.size(0) == 0) return out;
  std::vector<int64_t> rows = t.sizes().vec();
  rows[0] = static_cast<int64_t>(s.padded - s.count);
  return at::cat({out, t.narrow(0, t.size(0) - 1, 1).expand(rows)}, 0);
}
template <class Map, std::enable_if_t<is_splittable_map<Map>::value, int> = 0>
Map split_take(const Map& m, const SplitRange& s, bool apply_padding) {
  Map out;
  for (const auto& [k, v] : m) out.emplace(k, split_take(v, s, apply_padding));
  return out;
}

// What split_between_processes takes as a map's value: a tensor (split along dim 0), a
// vector, or another such map.
template <class V>
struct split_values_ok : std::bool_constant<std::is_same_v<V, at::Tensor> || is_std_vector<V>::value> {};
template <class K, class V, class C, class A>
struct split_values_ok<std::map<K, V, C, A>> : split_values_ok<V> {};
template <class K, class V, class H, class E, class A>
struct split_values_ok<std::unordered_map<K, V, H, E, A>> : split_values_ok<V> {};

}  // namespace hasten::detail
