// hasten::Serializer<T>: the small byte format in which gather_object and broadcast_object_list
// carry values between processes (Accelerate pickles them; C++ has no pickle).
//
// Built in: bool, integers, floating point, enums, std::string, std::vector, std::array,
// std::pair, std::tuple, std::optional, std::variant, std::map, std::unordered_map, and
// torch::Tensor (dtype, shape and data; it comes back as a contiguous CPU tensor), nested in
// any combination. A type of your own takes one specialisation:
//
//   struct Sample { std::string text; std::vector<float> scores; };
//   template <> struct hasten::Serializer<Sample> {
//     static void write(hasten::ByteWriter& out, const Sample& s) { out.write(s.text); out.write(s.scores); }
//     static Sample read(hasten::ByteReader& in) {
//       Sample s;
//       s.text = in.read<std::string>();
//       s.scores = in.read<std::vector<float>>();
//       return s;
//     }
//   };
//
// The bytes are in the machine's own byte order: the processes of one run share an architecture.
// Reading checks every length against the bytes that are left, so a rank that sends another
// type than the receiver reads is an error (hasten::Error naming the type), not a crash.
#pragma once

#include <hasten/error.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace hasten {

class ByteWriter;
class ByteReader;

// Specialise for your own types: static void write(ByteWriter&, const T&) and
// static T read(ByteReader&).
template <class T, class Enable = void>
struct Serializer {
  static_assert(sizeof(T) == 0,
                "hasten::Serializer<T> is not defined for this type: specialise it with "
                "static void write(hasten::ByteWriter&, const T&) and static T read(hasten::ByteReader&) "
                "(hasten/serialization.hpp)");
};

class ByteWriter {
 public:
  void write_bytes(const void* data, size_t n) {
    const auto* p = static_cast<const char*>(data);
    bytes_.append(p, n);
  }
  void write_size(size_t n) {
    const uint64_t v = n;
    write_bytes(&v, sizeof v);
  }
  template <class T>
  void write(const T& value) {
    Serializer<T>::write(*this, value);
  }
  const std::string& bytes() const { return bytes_; }
  std::string take() { return std::move(bytes_); }

 private:
  std::string bytes_;
};

class ByteReader {
 public:
  explicit ByteReader(const std::string& bytes) : data_(bytes.data()), left_(bytes.size()) {}
  void read_bytes(void* out, size_t n) {
    if (n > left_)
      throw Error("object collective: the bytes received end " + std::to_string(n - left_) +
                  " bytes early: the ranks do not send and receive the same type");
    std::memcpy(out, data_, n);
    data_ += n;
    left_ -= n;
  }
  // A count of elements, each taking at least min_bytes: a count that cannot fit in what is
  // left is refused before anything is allocated.
  size_t read_size(size_t min_bytes = 0) {
    uint64_t v = 0;
    read_bytes(&v, sizeof v);
    if (min_bytes > 0 && v > left_ / min_bytes)
      throw Error("object collective: a length of " + std::to_string(v) + " does not fit in the " +
                  std::to_string(left_) + " bytes received: the ranks do not send and receive the same type");
    return static_cast<size_t>(v);
  }
  template <class T>
  T read() {
    return Serializer<T>::read(*this);
  }
  size_t left() const { return left_; }

 private:
  const char* data_;
  size_t left_;
};

// Every value of T as bytes, and back; from_bytes insists that the bytes hold exactly one T.
template <class T>
std::string to_bytes(const T& value) {
  ByteWriter w;
  w.write(value);
  return w.take();
}
template <class T>
T from_bytes(const std::string& bytes) {
  ByteReader r(bytes);
  T value = r.read<T>();
  if (r.left() != 0)
    throw Error("object collective: " + std::to_string(r.left()) + " bytes left over after reading a " +
                typeid(T).name() + ": the ranks do not send and receive the same type");
  return value;
}

// bool, integers, floating point, enums: their bytes.
template <class T>
struct Serializer<T, std::enable_if_t<std::is_arithmetic_v<T> || std::is_enum_v<T>>> {
  static void write(ByteWriter& out, const T& v) { out.write_bytes(&v, sizeof v); }
  static T read(ByteReader& in) {
    if constexpr (std::is_same_v<T, bool>) {
      uint8_t b = 0;
      in.read_bytes(&b, 1);
      return b != 0;
    } else {
      T v{};
      in.read_bytes(&v, sizeof v);
      return v;
    }
  }
};

template <>
struct Serializer<std::string> {
  static void write(ByteWriter& out, const std::string& s) {
    out.write_size(s.size());
    out.write_bytes(s.data(), s.size());
  }
  static std::string read(ByteReader& in) {
    std::string s(in.read_size(1), '\0');
    in.read_bytes(s.data(), s.size());
    return s;
  }
};

namespace detail {
// The fewest bytes one element takes, so that a corrupt count is caught before allocating.
template <class T>
constexpr size_t min_serialized_bytes() {
  if constexpr (std::is_arithmetic_v<T> || std::is_enum_v<T>) return std::is_same_v<T, bool> ? 1 : sizeof(T);
  return 0;
}
}  // namespace detail

template <class T, class A>
struct Serializer<std::vector<T, A>> {
  static void write(ByteWriter& out, const std::vector<T, A>& v) {
    out.write_size(v.size());
    for (const auto& x : v) out.write(static_cast<const T&>(x));  // vector<bool>'s proxies too
  }
  static std::vector<T, A> read(ByteReader& in) {
    const size_t n = in.read_size(detail::min_serialized_bytes<T>());
    std::vector<T, A> v;
    v.reserve(std::min(n, in.left()));
    for (size_t i = 0; i < n; ++i) v.push_back(in.read<T>());
    return v;
  }
};

template <class T, size_t N>
struct Serializer<std::array<T, N>> {
  static void write(ByteWriter& out, const std::array<T, N>& v) {
    for (const auto& x : v) out.write(x);
  }
  static std::array<T, N> read(ByteReader& in) {
    return read_each(in, std::make_index_sequence<N>{});
  }

 private:
  template <size_t... I>
  static std::array<T, N> read_each(ByteReader& in, std::index_sequence<I...>) {
    return {{((void)I, in.read<T>())...}};  // braced: evaluated in order
  }
};

template <class A, class B>
struct Serializer<std::pair<A, B>> {
  static void write(ByteWriter& out, const std::pair<A, B>& p) {
    out.write(p.first);
    out.write(p.second);
  }
  static std::pair<A, B> read(ByteReader& in) {
    A a = in.read<A>();
    B b = in.read<B>();
    return {std::move(a), std::move(b)};
  }
};

template <class... T>
struct Serializer<std::tuple<T...>> {
  static void write(ByteWriter& out, const std::tuple<T...>& t) {
    std::apply([&out](const auto&... x) { (out.write(x), ...); }, t);
  }
  static std::tuple<T...> read(ByteReader& in) { return std::tuple<T...>{in.read<T>()...}; }  // braced: in order
};

template <class T>
struct Serializer<std::optional<T>> {
  static void write(ByteWriter& out, const std::optional<T>& v) {
    out.write(v.has_value());
    if (v) out.write(*v);
  }
  static std::optional<T> read(ByteReader& in) {
    if (!in.read<bool>()) return std::nullopt;
    return in.read<T>();
  }
};

template <class... T>
struct Serializer<std::variant<T...>> {
  static void write(ByteWriter& out, const std::variant<T...>& v) {
    out.write_size(v.index());
    std::visit([&out](const auto& x) { out.write(x); }, v);
  }
  static std::variant<T...> read(ByteReader& in) {
    const size_t index = in.read_size();
    if (index >= sizeof...(T))
      throw Error("object collective: variant alternative " + std::to_string(index) + " of " +
                  std::to_string(sizeof...(T)) + ": the ranks do not send and receive the same type");
    return read_alternative(in, index, std::index_sequence_for<T...>{});
  }

 private:
  template <size_t... I>
  static std::variant<T...> read_alternative(ByteReader& in, size_t index, std::index_sequence<I...>) {
    std::variant<T...> out;
    ((I == index ? (void)out.template emplace<I>(in.read<std::variant_alternative_t<I, std::variant<T...>>>())
                 : (void)0),
     ...);
    return out;
  }
};

namespace detail {
template <class Map>
struct MapSerializer {
  using K = typename Map::key_type;
  using V = typename Map::mapped_type;
  static void write(ByteWriter& out, const Map& m) {
    out.write_size(m.size());
    for (const auto& [k, v] : m) {
      out.write(k);
      out.write(v);
    }
  }
  static Map read(ByteReader& in) {
    const size_t n = in.read_size(min_serialized_bytes<K>() + min_serialized_bytes<V>());
    Map m;
    for (size_t i = 0; i < n; ++i) {
      K k = in.read<K>();
      V v = in.read<V>();
      m.emplace(std::move(k), std::move(v));
    }
    return m;
  }
};
}  // namespace detail

template <class K, class V, class C, class A>
struct Serializer<std::map<K, V, C, A>> : detail::MapSerializer<std::map<K, V, C, A>> {};
template <class K, class V, class H, class E, class A>
struct Serializer<std::unordered_map<K, V, H, E, A>> : detail::MapSerializer<std::unordered_map<K, V, H, E, A>> {};

// A tensor: defined or not, dtype, shape, then its elements (contiguous, from the CPU).
template <>
struct Serializer<at::Tensor> {
  static void write(ByteWriter& out, const at::Tensor& t) {
    out.write(t.defined());
    if (!t.defined()) return;
    out.write(static_cast<int8_t>(t.scalar_type()));
    out.write(t.sizes().vec());
    const at::Tensor c = t.to(at::kCPU).contiguous();
    out.write_bytes(c.data_ptr(), c.nbytes());
  }
  static at::Tensor read(ByteReader& in) {
    if (!in.read<bool>()) return at::Tensor();
    const auto dtype = static_cast<at::ScalarType>(in.read<int8_t>());
    if (static_cast<int>(dtype) < 0 || dtype >= at::ScalarType::NumOptions)
      throw Error("object collective: tensor dtype code " + std::to_string(static_cast<int>(dtype)) +
                  " is unknown: the ranks do not send and receive the same type");
    const auto sizes = in.read<std::vector<int64_t>>();
    // The element count must fit in what is left before anything is allocated.
    size_t bytes = c10::elementSize(dtype);
    for (int64_t s : sizes) {
      if (s < 0 || (s > 0 && bytes > in.left() / static_cast<size_t>(s)))
        throw Error("object collective: a tensor of size " + std::to_string(s) + " along one dimension does not fit "
                    "in the " + std::to_string(in.left()) + " bytes received: the ranks do not send and receive the same type");
      bytes *= static_cast<size_t>(s);
    }
    at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(dtype));
    in.read_bytes(t.data_ptr(), t.nbytes());
    return t;
  }
};

}  // namespace hasten
