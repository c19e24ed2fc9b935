// Element-wise reductions over raw buffers for the CPU comm plugins: sum, min and max of
// float32, float64, float16, bfloat16, int64 and int32, and the division that turns a sum
// into an average. Half-precision types reduce through float32, one rounding per step, as
// PyTorch's CPU kernels do. No LibTorch.
#pragma once

#include <hasten/plugin.hpp>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

namespace hasten::comm {

// c[i] = a[i] op b[i] for n elements; c may alias a.
using ReduceFn = std::function<void(void*, const void*, const void*, size_t)>;

inline float bf16_to_float(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline uint16_t float_to_bf16(float f) {  // round to nearest even, NaN kept quiet
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline uint16_t float_to_half(float f) {  // round to nearest even
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {  // subnormal or zero in half
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    // A half subnormal counts units of 2^-24: drop the float mantissa's low bits accordingly.
    const uint32_t drop = 13 + (113 - exp);
    uint32_t result = mant >> drop;
    const uint32_t rem = mant & ((1u << drop) - 1u), halfway = 1u << (drop - 1u);
    if (rem > halfway || (rem == halfway && (result & 1u))) ++result;
    return static_cast<uint16_t>(sign | result);
  }
  uint32_t result = ((abs >> 13) - (112u << 10));
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (result & 1u))) ++result;
  return static_cast<uint16_t>(sign | result);
}

enum class Type { F32, F64, F16, BF16, I64, I32 };

inline Type type_of(const DLDataType& d) {
  if (d.lanes == 1) {
    if (d.code == kDLFloat && d.bits == 32) return Type::F32;
    if (d.code == kDLFloat && d.bits == 64) return Type::F64;
    if (d.code == kDLFloat && d.bits == 16) return Type::F16;
    if (d.code == kDLBfloat && d.bits == 16) return Type::BF16;
    if (d.code == kDLInt && d.bits == 64) return Type::I64;
    if (d.code == kDLInt && d.bits == 32) return Type::I32;
  }
  throw sdk::Error(HASTEN_ERR_UNSUPPORTED,
                   "reduction of dtype (code " + std::to_string(d.code) + ", " + std::to_string(d.bits) +
                       " bits) is not supported (allowed: float32, float64, float16, bfloat16, int64, int32)");
}

template <class T, class Op>
void apply(void* c, const void* a, const void* b, size_t n, Op op) {
  auto* pc = static_cast<T*>(c);
  auto* pa = static_cast<const T*>(a);
  auto* pb = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) pc[i] = op(pa[i], pb[i]);
}

template <class ToF, class FromF, class Op>
void apply16(void* c, const void* a, const void* b, size_t n, ToF to, FromF from, Op op) {
  auto* pc = static_cast<uint16_t*>(c);
  auto* pa = static_cast<const uint16_t*>(a);
  auto* pb = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) pc[i] = from(op(to(pa[i]), to(pb[i])));
}

template <class Op>
ReduceFn kernel_for(Type t, Op op) {
  switch (t) {
    case Type::F32: return [op](void* c, const void* a, const void* b, size_t n) { apply<float>(c, a, b, n, op); };
    case Type::F64: return [op](void* c, const void* a, const void* b, size_t n) { apply<double>(c, a, b, n, op); };
    case Type::I64: return [op](void* c, const void* a, const void* b, size_t n) { apply<int64_t>(c, a, b, n, op); };
    case Type::I32: return [op](void* c, const void* a, const void* b, size_t n) { apply<int32_t>(c, a, b, n, op); };
    case Type::F16:
      return [op](void* c, const void* a, const void* b, size_t n) {
        apply16(c, a, b, n, half_to_float, float_to_half, [op](float x, float y) { return op(x, y); });
      };
    case Type::BF16:
      return [op](void* c, const void* a, const void* b, size_t n) {
        apply16(c, a, b, n, bf16_to_float, float_to_bf16, [op](float x, float y) { return op(x, y); });
      };
  }
  return nullptr;
}

struct Sum {
  template <class T>
  T operator()(T x, T y) const { return x + y; }
};
struct Min {
  template <class T>
  T operator()(T x, T y) const { return y < x ? y : x; }
};
struct Max {
  template <class T>
  T operator()(T x, T y) const { return y > x ? y : x; }
};

// The kernel of (dtype, op); AVG reduces with SUM (then divide()). Throws for bad input.
inline ReduceFn reduce_kernel(const DLDataType& dtype, hasten_reduce_op op) {
  const Type t = type_of(dtype);
  switch (op) {
    case HASTEN_REDUCE_SUM:
    case HASTEN_REDUCE_AVG: return kernel_for(t, Sum{});
    case HASTEN_REDUCE_MIN: return kernel_for(t, Min{});
    case HASTEN_REDUCE_MAX: return kernel_for(t, Max{});
  }
  throw sdk::Error(HASTEN_ERR_INVALID_ARGUMENT,
                   "unknown reduce op " + std::to_string(static_cast<int>(op)) + " (allowed: 0 sum, 1 avg, 2 min, 3 max)");
}

// buffer /= world (integer types: truncating division, as C++ does).
inline void divide(void* buffer, size_t n, const DLDataType& dtype, int world) {
  switch (type_of(dtype)) {
    case Type::F32: {
      auto* p = static_cast<float*>(buffer);
      const float w = static_cast<float>(world);
      for (size_t i = 0; i < n; ++i) p[i] /= w;
      break;
    }
    case Type::F64: {
      auto* p = static_cast<double*>(buffer);
      for (size_t i = 0; i < n; ++i) p[i] /= world;
      break;
    }
    case Type::I64: {
      auto* p = static_cast<int64_t*>(buffer);
      for (size_t i = 0; i < n; ++i) p[i] /= world;
      break;
    }
    case Type::I32: {
      auto* p = static_cast<int32_t*>(buffer);
      for (size_t i = 0; i < n; ++i) p[i] /= world;
      break;
    }
    case Type::F16: {
      auto* p = static_cast<uint16_t*>(buffer);
      for (size_t i = 0; i < n; ++i) p[i] = float_to_half(half_to_float(p[i]) / static_cast<float>(world));
      break;
    }
    case Type::BF16: {
      auto* p = static_cast<uint16_t*>(buffer);
      for (size_t i = 0; i < n; ++i) p[i] = float_to_bf16(bf16_to_float(p[i]) / static_cast<float>(world));
      break;
    }
  }
}

}  // namespace hasten::comm
