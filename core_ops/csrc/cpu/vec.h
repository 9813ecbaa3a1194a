// core_ops' own CPU vector layer: the part of ATen's at::vec the CPU kernels use,
// under the same names (vec::Vectorized<float>, vec::fmadd, vec::convert_to_float, ...),
// so the kernels need nothing of ATen (which is not part of torch's stable ABI).
//
// Note [Vector levels]: one implementation per level of Note [CPU levels], chosen by
// the compiler's macros, so each level's objects hold that level's instructions only:
//   - AVX-512 (__AVX512F__ with BW, DQ and VL): 16 float lanes, vec_avx512.h;
//   - AVX2 (__AVX2__ with FMA and F16C): 8 float lanes, vec_avx2.h;
//   - anything else (x86-64 baseline SSE2, aarch64's neon level, ...): 8 float lanes
//     as two 16-byte halves in GCC vector extensions, vec_portable.h (SSE2 or NEON for
//     the few operations the extensions lack: sqrt, aarch64's fused fmadd and half
//     conversions). CORE_OPS_VEC_GENERIC forces this path with no intrinsics at all:
//     how tests/test_cpu_vec.py runs the aarch64 code's vector-extension part on x86.
// Exactly one of CORE_OPS_VEC_AVX512 / CORE_OPS_VEC_AVX2 / CORE_OPS_VEC_PORTABLE is
// defined afterwards, for kernels that use an instruction of their own (a streaming
// store, a byte widening) on the vectors' registers.
//
// Note [Vector results as at::vec]: every operation gives, bit for bit, what at::vec
// gives at the same level (at::vec's AVX512 / AVX2 / DEFAULT implementations), so
// moving the kernels here changed no result. On aarch64 the neon level is the
// DEFAULT one with three NEON instructions (above), not torch's own NEON / SVE
// vectors: those are 4 float lanes, so a reduction there pairs other lanes. That includes where at::vec's levels
// differ from one another:
//   - fmadd is fused (one rounding) where the level has FMA (AVX2, AVX-512, neon),
//     a * b + c (two) at the x86-64 baseline;
//   - maximum / minimum return a NaN when either input is one: all ones (0xFFFFFFFF)
//     at AVX2 / AVX-512, the NaN input itself at baseline (a's when both are);
//   - a float NaN converted to bfloat16 is 0xFFFF at AVX2 / AVX-512 and 0x7FC0 at
//     baseline (torch's scalar conversion); to half it is what the level's scalar
//     conversion gives (F16C's or aarch64's FCVT's quieted payload, or 0x7E00 with
//     the sign at the x86-64 baseline);
//     every other value rounds to nearest, ties to even, at every level;
//   - vec_reduce_all<float> folds the lanes in a tree at AVX2 / AVX-512 (halves, then
//     quarters, ...) and one lane after another from lane 0 at baseline.
// Comparisons return masks: lanes of all ones (true) or all zeros, as at::vec's
// operators (not its eq() / gt() methods, which return 1.0 / 0.0 and are not here).
// blendv(a, b, mask) takes b where mask's lane is all ones, a where it is zero.
// loadu(p, count) reads the first count lanes and zeroes the others (at::vec's int
// vectors put 1 there; no kernel loads a partial int vector); store(p, count) writes
// the first count lanes only.
#pragma once

#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>

#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include "level.h"

CORE_OPS_CPU_BEGIN
namespace vec {

// Vectorized<float> and Vectorized<int32_t> are one register's worth of lanes (two
// halves at baseline); Vectorized<Half> and Vectorized<BFloat16> hold twice as many
// 16-bit lanes in the same bytes, converted to and from a pair of float vectors.
template <typename T>
class Vectorized;

}  // namespace vec
CORE_OPS_CPU_END

#if !defined(CORE_OPS_VEC_GENERIC) && defined(__AVX512F__) && defined(__AVX512BW__) && \
    defined(__AVX512DQ__) && defined(__AVX512VL__) && defined(__FMA__) && defined(__F16C__)
#define CORE_OPS_VEC_AVX512 1
#include "vec_avx512.h"
#elif !defined(CORE_OPS_VEC_GENERIC) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define CORE_OPS_VEC_AVX2 1
#include "vec_avx2.h"
#else
#define CORE_OPS_VEC_PORTABLE 1
#include "vec_portable.h"
#endif

CORE_OPS_CPU_BEGIN
namespace vec {

using Half = torch::headeronly::Half;
using BFloat16 = torch::headeronly::BFloat16;

// A vector of 16-bit floats as two float vectors (its first and second halves).
template <typename T>
inline std::tuple<Vectorized<float>, Vectorized<float>> convert_to_float(const Vectorized<T>& v) {
  static_assert(std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>,
                "convert_to_float takes a vector of Half or BFloat16");
  if constexpr (std::is_same_v<T, Half>) {
    return half_to_float(v);
  } else {
    return bfloat16_to_float(v);
  }
}

template <typename T>
inline Vectorized<T> convert_from_float(const Vectorized<float>& a, const Vectorized<float>& b) {
  static_assert(std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>,
                "convert_from_float makes a vector of Half or BFloat16");
  if constexpr (std::is_same_v<T, Half>) {
    return float_to_half(a, b);
  } else {
    return float_to_bfloat16(a, b);
  }
}

// The same bits seen as lanes of another type (float <-> int32_t), as at::vec::cast.
template <typename To, typename From>
inline Vectorized<To> cast(const Vectorized<From>& v) {
  static_assert(sizeof(Vectorized<To>) == sizeof(Vectorized<From>), "cast keeps the vector's bytes");
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, int32_t> && std::is_same_v<From, float>) {
    return bits_of(v);
  } else if constexpr (std::is_same_v<To, float> && std::is_same_v<From, int32_t>) {
    return floats_of(v);
  } else {
    Vectorized<To> out;
    std::memcpy(&out, &v, sizeof(out));
    return out;
  }
}

// All lanes folded into one with op (a lane-wise function of two vectors, called with
// lvalues it may take by non-const reference), in at::vec's order (Note [Vector results
// as at::vec]): the level's tree for float where it has one, else lane by lane.
template <typename scalar_t, typename Op>
inline scalar_t vec_reduce_all(const Op& op, const Vectorized<scalar_t>& v) {
  if constexpr (std::is_same_v<scalar_t, float> && kTreeReduce) {
    return reduce_tree(op, v);
  } else {
    using V = Vectorized<scalar_t>;
    scalar_t lanes[V::size()];
    v.store(lanes);
    V acc = v;
    for (int i = 1; i < V::size(); ++i) {
      scalar_t next[V::size()] = {};
      next[0] = lanes[i];
      V n = V::loadu(next);
      acc = op(acc, n);
    }
    acc.store(lanes);
    return lanes[0];
  }
}

template <typename T>
inline Vectorized<T>& operator+=(Vectorized<T>& a, const Vectorized<T>& b) { return a = a + b; }
template <typename T>
inline Vectorized<T>& operator-=(Vectorized<T>& a, const Vectorized<T>& b) { return a = a - b; }
template <typename T>
inline Vectorized<T>& operator*=(Vectorized<T>& a, const Vectorized<T>& b) { return a = a * b; }
inline Vectorized<float>& operator/=(Vectorized<float>& a, const Vectorized<float>& b) { return a = a / b; }

}  // namespace vec
CORE_OPS_CPU_END
