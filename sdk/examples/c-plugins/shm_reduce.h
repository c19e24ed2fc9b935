/*
 * The element-wise reductions of the c_shm example: combine (acc = acc op in) and divide (for
 * AVG, which reduces with SUM first), for float32, float64, float16, bfloat16, int32 and
 * int64. Half-precision types reduce through float, one rounding per step, as PyTorch's CPU
 * kernels and the first-party shm plugin do, so the backends agree bit for bit. Plain loops;
 * speed is the first-party plugin's job.
 */
#ifndef C_SHM_REDUCE_H
#define C_SHM_REDUCE_H

#include <hasten/plugin.h>

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct {
  void (*combine)(void* acc, const void* in, size_t n, int32_t op); /* op: a hasten_reduce_op */
  void (*divide)(void* acc, size_t n, int by);
} shm_reducer;

/* ---- float16 and bfloat16 through float ---- */

static float bf16_to_float(uint16_t h) {
  const uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}
static uint16_t float_to_bf16(float f) { /* round to nearest even, NaN kept quiet */
  uint32_t bits;
  memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}
static float half_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  float f;
  if (exp == 0 && mant == 0) {
    bits = sign;
  } else if (exp == 0) { /* subnormal: normalise */
    exp = 127 - 15 + 1;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  memcpy(&f, &bits, 4);
  return f;
}
static uint16_t float_to_half(float f) { /* round to nearest even */
  uint32_t x, result, rem;
  memcpy(&x, &f, 4);
  {
    const uint32_t sign = (x >> 16) & 0x8000u, abs = x & 0x7fffffffu;
    if (abs > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
    if (abs >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow: infinity */
    if (abs < 0x38800000u) {                                   /* subnormal or zero in half */
      uint32_t drop, halfway;
      if (abs < 0x33000000u) return (uint16_t)sign;
      /* A half subnormal counts units of 2^-24: drop the float mantissa's low bits accordingly. */
      drop = 13 + (113 - (abs >> 23));
      result = ((abs & 0x7fffffu) | 0x800000u) >> drop;
      rem = ((abs & 0x7fffffu) | 0x800000u) & ((1u << drop) - 1u);
      halfway = 1u << (drop - 1u);
      if (rem > halfway || (rem == halfway && (result & 1u))) ++result;
      return (uint16_t)(sign | result);
    }
    result = (abs >> 13) - (112u << 10);
    rem = abs & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (result & 1u))) ++result;
    return (uint16_t)(sign | result);
  }
}

/* MIN and MAX keep a NaN, as torch does. */
#define C_SHM_IS_NAN(x) ((x) != (x))
#define C_SHM_NO_NAN(x) 0
#define C_SHM_PICK(op, a, b, NAN_TEST) \
  ((op) == HASTEN_REDUCE_MIN ? (((b) < (a) || NAN_TEST(b)) ? (b) : (a)) \
   : (op) == HASTEN_REDUCE_MAX ? (((b) > (a) || NAN_TEST(b)) ? (b) : (a)) : (a) + (b))

/* T: the stored type; W: the type it is computed in; LOAD and STORE convert between them. */
#define C_SHM_REDUCER(T, W, LOAD, STORE, NAN_TEST, suffix)                        \
  static void combine_##suffix(void* acc, const void* in, size_t n, int32_t op) { \
    T* a = (T*)acc;                                                               \
    const T* b = (const T*)in;                                                    \
    size_t i;                                                                     \
    for (i = 0; i < n; ++i) {                                                     \
      const W x = LOAD(a[i]), y = LOAD(b[i]);                                     \
      a[i] = STORE(C_SHM_PICK(op, x, y, NAN_TEST));                               \
    }                                                                             \
  }                                                                               \
  static void divide_##suffix(void* acc, size_t n, int by) {                      \
    T* a = (T*)acc;                                                               \
    size_t i;                                                                     \
    for (i = 0; i < n; ++i) a[i] = STORE(LOAD(a[i]) / (W)by);                     \
  }

#define C_SHM_SAME(x) (x)
C_SHM_REDUCER(float, float, C_SHM_SAME, C_SHM_SAME, C_SHM_IS_NAN, f32)
C_SHM_REDUCER(double, double, C_SHM_SAME, C_SHM_SAME, C_SHM_IS_NAN, f64)
C_SHM_REDUCER(int32_t, int32_t, C_SHM_SAME, C_SHM_SAME, C_SHM_NO_NAN, i32)
C_SHM_REDUCER(int64_t, int64_t, C_SHM_SAME, C_SHM_SAME, C_SHM_NO_NAN, i64)
C_SHM_REDUCER(uint16_t, float, half_to_float, float_to_half, C_SHM_IS_NAN, f16)
C_SHM_REDUCER(uint16_t, float, bf16_to_float, float_to_bf16, C_SHM_IS_NAN, bf16)

/* 0 for a dtype it does not handle. */
static int shm_reducer_for(DLDataType dtype, shm_reducer* out) {
  if (dtype.lanes != 1) return 0;
  if (dtype.code == kDLFloat && dtype.bits == 32) *out = (shm_reducer){combine_f32, divide_f32};
  else if (dtype.code == kDLFloat && dtype.bits == 64) *out = (shm_reducer){combine_f64, divide_f64};
  else if (dtype.code == kDLFloat && dtype.bits == 16) *out = (shm_reducer){combine_f16, divide_f16};
  else if (dtype.code == kDLBfloat && dtype.bits == 16) *out = (shm_reducer){combine_bf16, divide_bf16};
  else if (dtype.code == kDLInt && dtype.bits == 32) *out = (shm_reducer){combine_i32, divide_i32};
  else if (dtype.code == kDLInt && dtype.bits == 64) *out = (shm_reducer){combine_i64, divide_i64};
  else return 0;
  return 1;
}

#endif /* C_SHM_REDUCE_H */
