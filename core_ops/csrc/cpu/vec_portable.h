// The baseline level of vec.h (Note [Vector levels]): x86-64 SSE2, aarch64 and any
// other CPU. 8 float / int32 lanes as two 16-byte halves in GCC vector extensions
// (which GCC and clang turn into SSE2 or NEON instructions), 16 half / bfloat16 lanes
// in the same 32 bytes. Results as at::vec's DEFAULT level, whose loops run lane by
// lane through torch's scalar functions (Note [Vector results as at::vec]).
// Include vec.h, not this.
#pragma once

#if !defined(CORE_OPS_VEC_GENERIC) && defined(__SSE2__)
#include <emmintrin.h>
#define CORE_OPS_VEC_SSE2 1
#elif !defined(CORE_OPS_VEC_GENERIC) && defined(__ARM_NEON)
#include <arm_neon.h>
#define CORE_OPS_VEC_NEON 1
#endif

CORE_OPS_CPU_BEGIN
namespace vec {

typedef float f32x4 __attribute__((vector_size(16)));
typedef int32_t i32x4 __attribute__((vector_size(16)));
typedef uint32_t u32x4 __attribute__((vector_size(16)));
typedef uint16_t u16x8 __attribute__((vector_size(16)));

// Casts between vector types of one size keep the bits (GCC's and clang's rule).
inline i32x4 as_i(f32x4 x) { return (i32x4)x; }
inline u32x4 as_u(f32x4 x) { return (u32x4)x; }
inline f32x4 as_f(i32x4 x) { return (f32x4)x; }
inline f32x4 as_f(u32x4 x) { return (f32x4)x; }
inline i32x4 splat(int32_t x) { return i32x4{x, x, x, x}; }
inline u32x4 splat_u(uint32_t x) { return u32x4{x, x, x, x}; }
inline f32x4 splat_f(float x) { return f32x4{x, x, x, x}; }
// a where mask's lane is all ones, b where it is zero.
inline i32x4 select(i32x4 mask, i32x4 a, i32x4 b) { return (a & mask) | (b & ~mask); }
inline f32x4 select(i32x4 mask, f32x4 a, f32x4 b) { return as_f(select(mask, as_i(a), as_i(b))); }
inline u32x4 select(i32x4 mask, u32x4 a, u32x4 b) { return (a & u32x4(mask)) | (b & ~u32x4(mask)); }

inline f32x4 sqrt4(f32x4 x) {
#if defined(CORE_OPS_VEC_SSE2)
  return f32x4(_mm_sqrt_ps(__m128(x)));
#elif defined(CORE_OPS_VEC_NEON) && defined(__aarch64__)
  return f32x4(vsqrtq_f32(float32x4_t(x)));
#else
  f32x4 out;
  for (int i = 0; i < 4; ++i) out[i] = __builtin_sqrtf(x[i]);
  return out;
#endif
}

// Two halves of 16 bytes; every operation applies to both.
template <typename H>
struct Halves {
  H lo, hi;
};

// The loads and stores of a vector (Derived) of two halves H, in lanes of Lane.
template <typename Derived, typename H, typename Lane>
class Stored {
 public:
  Halves<H> h;

  static constexpr int size() { return int(sizeof(Halves<H>) / sizeof(Lane)); }
  static Derived loadu(const void* p) {
    Derived out;
    std::memcpy(&out.h, p, sizeof(out.h));
    return out;
  }
  // The first `count` lanes from p, the others zero; reads nothing past them.
  static Derived loadu(const void* p, int64_t count) {
    Derived out;
    out.h = Halves<H>{H{}, H{}};
    std::memcpy(&out.h, p, static_cast<size_t>(clamp(count)) * sizeof(Lane));
    return out;
  }
  void store(void* p) const { std::memcpy(p, &h, sizeof(h)); }
  void store(void* p, int64_t count) const { std::memcpy(p, &h, static_cast<size_t>(clamp(count)) * sizeof(Lane)); }

 private:
  static int64_t clamp(int64_t count) { return count < 0 ? 0 : count > size() ? size() : count; }
};

template <>
class Vectorized<float> : public Stored<Vectorized<float>, f32x4, float> {
 public:
  using value_type = float;
  Vectorized() = default;
  Vectorized(Halves<f32x4> v) { h = v; }
  Vectorized(f32x4 lo, f32x4 hi) { h = {lo, hi}; }
  Vectorized(float x) { h = {splat_f(x), splat_f(x)}; }

  Vectorized abs() const { return {as_f(as_i(h.lo) & splat(0x7FFFFFFF)), as_f(as_i(h.hi) & splat(0x7FFFFFFF))}; }
  Vectorized neg() const { return {as_f(as_i(h.lo) ^ splat(INT32_MIN)), as_f(as_i(h.hi) ^ splat(INT32_MIN))}; }
  Vectorized sqrt() const { return {sqrt4(h.lo), sqrt4(h.hi)}; }
  Vectorized operator-() const { return neg(); }

  // GCC's vector comparisons are IEEE's: != is true for a NaN, the others false.
  Vectorized operator==(const Vectorized& o) const { return {as_f(h.lo == o.h.lo), as_f(h.hi == o.h.hi)}; }
  Vectorized operator!=(const Vectorized& o) const { return {as_f(h.lo != o.h.lo), as_f(h.hi != o.h.hi)}; }
  Vectorized operator<(const Vectorized& o) const { return {as_f(h.lo < o.h.lo), as_f(h.hi < o.h.hi)}; }
  Vectorized operator<=(const Vectorized& o) const { return {as_f(h.lo <= o.h.lo), as_f(h.hi <= o.h.hi)}; }
  Vectorized operator>(const Vectorized& o) const { return {as_f(h.lo > o.h.lo), as_f(h.hi > o.h.hi)}; }
  Vectorized operator>=(const Vectorized& o) const { return {as_f(h.lo >= o.h.lo), as_f(h.hi >= o.h.hi)}; }

  static Vectorized blendv(const Vectorized& a, const Vectorized& b, const Vectorized& mask) {
    return {select(as_i(mask.h.lo), b.h.lo, a.h.lo), select(as_i(mask.h.hi), b.h.hi, a.h.hi)};
  }
};

inline Vectorized<float> operator+(const Vectorized<float>& a, const Vectorized<float>& b) { return {a.h.lo + b.h.lo, a.h.hi + b.h.hi}; }
inline Vectorized<float> operator-(const Vectorized<float>& a, const Vectorized<float>& b) { return {a.h.lo - b.h.lo, a.h.hi - b.h.hi}; }
inline Vectorized<float> operator*(const Vectorized<float>& a, const Vectorized<float>& b) { return {a.h.lo * b.h.lo, a.h.hi * b.h.hi}; }
inline Vectorized<float> operator/(const Vectorized<float>& a, const Vectorized<float>& b) { return {a.h.lo / b.h.lo, a.h.hi / b.h.hi}; }
inline Vectorized<float> operator&(const Vectorized<float>& a, const Vectorized<float>& b) {
  return {as_f(as_i(a.h.lo) & as_i(b.h.lo)), as_f(as_i(a.h.hi) & as_i(b.h.hi))};
}
inline Vectorized<float> operator|(const Vectorized<float>& a, const Vectorized<float>& b) {
  return {as_f(as_i(a.h.lo) | as_i(b.h.lo)), as_f(as_i(a.h.hi) | as_i(b.h.hi))};
}
inline Vectorized<float> operator^(const Vectorized<float>& a, const Vectorized<float>& b) {
  return {as_f(as_i(a.h.lo) ^ as_i(b.h.lo)), as_f(as_i(a.h.hi) ^ as_i(b.h.hi))};
}
inline Vectorized<float> operator~(const Vectorized<float>& a) { return {as_f(~as_i(a.h.lo)), as_f(~as_i(a.h.hi))}; }

// Fused where the CPU always has FMA (aarch64, as at::vec's NEON fmadd); x86-64's
// baseline has none, and at::vec's DEFAULT level rounds the product, then the sum.
inline f32x4 fmadd4(f32x4 a, f32x4 b, f32x4 c) {
#if defined(CORE_OPS_VEC_NEON) && defined(__aarch64__)
  return f32x4(vfmaq_f32(float32x4_t(c), float32x4_t(a), float32x4_t(b)));
#else
  return a * b + c;
#endif
}
inline Vectorized<float> fmadd(const Vectorized<float>& a, const Vectorized<float>& b, const Vectorized<float>& c) {
  return {fmadd4(a.h.lo, b.h.lo, c.h.lo), fmadd4(a.h.hi, b.h.hi, c.h.hi)};
}

// IEEE 754-2019 maximum / minimum as at::vec's DEFAULT level: a > b ? a : b, except
// that a NaN a is returned as it is (so a NaN in either lane gives a NaN).
inline f32x4 maximum4(f32x4 a, f32x4 b) { return select((a > b) | (a != a), a, b); }
inline f32x4 minimum4(f32x4 a, f32x4 b) { return select((a < b) | (a != a), a, b); }
inline Vectorized<float> maximum(const Vectorized<float>& a, const Vectorized<float>& b) {
  return {maximum4(a.h.lo, b.h.lo), maximum4(a.h.hi, b.h.hi)};
}
inline Vectorized<float> minimum(const Vectorized<float>& a, const Vectorized<float>& b) {
  return {minimum4(a.h.lo, b.h.lo), minimum4(a.h.hi, b.h.hi)};
}

template <>
class Vectorized<int32_t> : public Stored<Vectorized<int32_t>, i32x4, int32_t> {
 public:
  using value_type = int32_t;
  Vectorized() = default;
  Vectorized(Halves<i32x4> v) { h = v; }
  Vectorized(i32x4 lo, i32x4 hi) { h = {lo, hi}; }
  Vectorized(int32_t x) { h = {splat(x), splat(x)}; }

  Vectorized abs() const { return {select(h.lo < 0, -h.lo, h.lo), select(h.hi < 0, -h.hi, h.hi)}; }
  Vectorized neg() const { return {-h.lo, -h.hi}; }
  Vectorized operator-() const { return neg(); }

  Vectorized operator==(const Vectorized& o) const { return {h.lo == o.h.lo, h.hi == o.h.hi}; }
  Vectorized operator!=(const Vectorized& o) const { return {h.lo != o.h.lo, h.hi != o.h.hi}; }
  Vectorized operator<(const Vectorized& o) const { return {h.lo < o.h.lo, h.hi < o.h.hi}; }
  Vectorized operator<=(const Vectorized& o) const { return {h.lo <= o.h.lo, h.hi <= o.h.hi}; }
  Vectorized operator>(const Vectorized& o) const { return {h.lo > o.h.lo, h.hi > o.h.hi}; }
  Vectorized operator>=(const Vectorized& o) const { return {h.lo >= o.h.lo, h.hi >= o.h.hi}; }

  static Vectorized blendv(const Vectorized& a, const Vectorized& b, const Vectorized& mask) {
    return {select(mask.h.lo, b.h.lo, a.h.lo), select(mask.h.hi, b.h.hi, a.h.hi)};
  }
};

// Wrapping arithmetic, as the hardware's (computed unsigned: no signed overflow).
inline Vectorized<int32_t> operator+(const Vectorized<int32_t>& a, const Vectorized<int32_t>& b) {
  return {i32x4(u32x4(a.h.lo) + u32x4(b.h.lo)), i32x4(u32x4(a.h.hi) + u32x4(b.h.hi))};
}
inline Vectorized<int32_t> operator-(const Vectorized<int32_t>& a, const Vectorized<int32_t>& b) {
  return {i32x4(u32x4(a.h.lo) - u32x4(b.h.lo)), i32x4(u32x4(a.h.hi) - u32x4(b.h.hi))};
}
inline Vectorized<int32_t> operator*(const Vectorized<int32_t>& a, const Vectorized<int32_t>& b) {
  return {i32x4(u32x4(a.h.lo) * u32x4(b.h.lo)), i32x4(u32x4(a.h.hi) * u32x4(b.h.hi))};
}
inline Vectorized<int32_t> operator&(const Vectorized<int32_t>& a, const Vectorized<int32_t>& b) { return {a.h.lo & b.h.lo, a.h.hi & b.h.hi}; }
inline Vectorized<int32_t> operator|(const Vectorized<int32_t>& a, const Vectorized<int32_t>& b) { return {a.h.lo | b.h.lo, a.h.hi | b.h.hi}; }
inline Vectorized<int32_t> operator^(const Vectorized<int32_t>& a, const Vectorized<int32_t>& b) { return {a.h.lo ^ b.h.lo, a.h.hi ^ b.h.hi}; }
inline Vectorized<int32_t> operator~(const Vectorized<int32_t>& a) { return {~a.h.lo, ~a.h.hi}; }

// Shifts by each lane's count: past 31 (or negative), << gives 0 and >> the sign, as
// at::vec (a shift by 32 or more is undefined in C++, so the count is clamped first).
inline i32x4 shl4(i32x4 a, i32x4 n) {
  const i32x4 in_range = u32x4(n) < 32u;
  return select(in_range, i32x4(u32x4(a) << (u32x4(n) & 31u)), splat(0));
}
inline i32x4 sar4(i32x4 a, i32x4 n) {
  const i32x4 count = select(u32x4(n) < 32u, n, splat(31));
  return a >> count;
}
inline Vectorized<int32_t> operator<<(const Vectorized<int32_t>& a, const Vectorized<int32_t>& n) {
  return {shl4(a.h.lo, n.h.lo), shl4(a.h.hi, n.h.hi)};
}
inline Vectorized<int32_t> operator>>(const Vectorized<int32_t>& a, const Vectorized<int32_t>& n) {
  return {sar4(a.h.lo, n.h.lo), sar4(a.h.hi, n.h.hi)};
}

inline Vectorized<int32_t> maximum(const Vectorized<int32_t>& a, const Vectorized<int32_t>& b) {
  return {select(a.h.lo > b.h.lo, a.h.lo, b.h.lo), select(a.h.hi > b.h.hi, a.h.hi, b.h.hi)};
}
inline Vectorized<int32_t> minimum(const Vectorized<int32_t>& a, const Vectorized<int32_t>& b) {
  return {select(a.h.lo < b.h.lo, a.h.lo, b.h.lo), select(a.h.hi < b.h.hi, a.h.hi, b.h.hi)};
}

inline Vectorized<int32_t> bits_of(const Vectorized<float>& v) { return {as_i(v.h.lo), as_i(v.h.hi)}; }
inline Vectorized<float> floats_of(const Vectorized<int32_t>& v) { return {as_f(v.h.lo), as_f(v.h.hi)}; }

// Lane i of the result is the T at byte offset index[i] * scale from base.
template <int64_t scale = 1, typename T>
inline Vectorized<T> gather(const T* base, const Vectorized<int32_t>& index) {
  static_assert(scale == 1 || scale == 2 || scale == 4 || scale == 8, "gather's scale is 1, 2, 4 or 8");
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, int32_t>, "gather reads float or int32_t");
  int32_t at[8];
  T out[8];
  index.store(at);
  for (int i = 0; i < 8; ++i) {
    std::memcpy(&out[i], reinterpret_cast<const char*>(base) + int64_t(at[i]) * scale, sizeof(T));
  }
  return Vectorized<T>::loadu(out);
}

// 16 half or bfloat16 lanes (their bits).
template <typename T>
class Vectorized : public Stored<Vectorized<T>, u16x8, T> {
  static_assert(std::is_same_v<T, torch::headeronly::Half> || std::is_same_v<T, torch::headeronly::BFloat16>,
                "vec::Vectorized holds float, int32_t, Half or BFloat16");

 public:
  using value_type = T;
  Vectorized() = default;
  Vectorized(u16x8 lo, u16x8 hi) { this->h = {lo, hi}; }
};

// 16-bit lanes 0-3 (low) or 4-7 (high) of x, widened to 32 bits.
inline u32x4 widen_low(u16x8 x) {
#if defined(CORE_OPS_VEC_SSE2)
  return u32x4(_mm_unpacklo_epi16(__m128i(x), _mm_setzero_si128()));
#else
  return u32x4{x[0], x[1], x[2], x[3]};
#endif
}
inline u32x4 widen_high(u16x8 x) {
#if defined(CORE_OPS_VEC_SSE2)
  return u32x4(_mm_unpackhi_epi16(__m128i(x), _mm_setzero_si128()));
#else
  return u32x4{x[4], x[5], x[6], x[7]};
#endif
}
// The low 16 bits of a's lanes, then b's (each lane below 0x10000).
inline u16x8 narrow(u32x4 a, u32x4 b) {
#if defined(CORE_OPS_VEC_SSE2)
  // packs saturates signed: a lane sign-extended from its 16 bits passes unchanged.
  const __m128i sa = _mm_srai_epi32(_mm_slli_epi32(__m128i(a), 16), 16);
  const __m128i sb = _mm_srai_epi32(_mm_slli_epi32(__m128i(b), 16), 16);
  return u16x8(_mm_packs_epi32(sa, sb));
#else
  return u16x8{uint16_t(a[0]), uint16_t(a[1]), uint16_t(a[2]), uint16_t(a[3]),
               uint16_t(b[0]), uint16_t(b[1]), uint16_t(b[2]), uint16_t(b[3])};
#endif
}

// Half bits (in 32-bit lanes) to float, exact; a signaling NaN comes back quieted,
// as torch's scalar conversion does (on x86-64; aarch64 has an instruction, below).
inline f32x4 half_lanes_to_float(u32x4 x) {
  const u32x4 sign = (x & 0x8000u) << 16;
  const u32x4 exponent = x & 0x7C00u;
  const u32x4 mantissa = x & 0x03FFu;
  // Normal: rebias the exponent (15 -> 127), widen the mantissa (10 -> 23 bits).
  const u32x4 normal = ((exponent + (112u << 10)) << 13) | (mantissa << 13);
  // Infinity / NaN: the largest exponent, the mantissa kept, a NaN quieted.
  const u32x4 special = splat_u(0x7F800000u) | (mantissa << 13) | select(mantissa != 0u, splat_u(0x00400000u), splat_u(0));
  // Zero / subnormal: mantissa * 2^-24, read off 0.5 + mantissa * 2^-24 (a float of
  // exponent -1, whose ulp is 2^-24) by subtracting 0.5: exact.
  const u32x4 subnormal = as_u(as_f(splat_u(0x3F000000u) | mantissa) - splat_f(0.5f));
  const u32x4 magnitude = select(exponent == 0x7C00u, special, select(exponent == 0u, subnormal, normal));
  return as_f(sign | magnitude);
}

// Float to half bits (in 32-bit lanes), rounded to nearest, ties to even; a NaN is
// 0x7E00 with its sign, as torch's scalar conversion without F16C.
inline u32x4 float_to_half_lanes(f32x4 f) {
  const u32x4 x = as_u(f);
  const u32x4 sign = (x >> 16) & 0x8000u;
  const u32x4 a = x & 0x7FFFFFFFu;
  // Normal halves (|f| >= 2^-14): rebias the exponent, then drop 13 mantissa bits
  // rounding to even (add 0xFFF plus the lowest kept bit); a carry moves the exponent.
  const u32x4 normal = (a - (112u << 23) + 0x0FFFu + ((a >> 13) & 1u)) >> 13;
  // Subnormal halves: |f| + 0.5 is a float of exponent -1, whose ulp (2^-24) is the
  // half subnormals' step: the addition rounds |f| to that step, to even.
  const u32x4 subnormal = as_u(as_f(a) + splat_f(0.5f)) - 0x3F000000u;
  // 65520 (0x477FF000) and above round to infinity: past the largest half, 65504.
  u32x4 magnitude = select(a < 0x38800000u, subnormal, normal);
  magnitude = select(a >= 0x477FF000u, splat_u(0x7C00u), magnitude);
  magnitude = select(a > 0x7F800000u, splat_u(0x7E00u), magnitude);
  return sign | magnitude;
}

inline f32x4 bfloat16_lanes_to_float(u32x4 x) { return as_f(x << 16); }

// Round to nearest, ties to even: add 0x7FFF plus the kept part's lowest bit, keep the
// top 16 bits. A NaN becomes 0x7FC0, as torch's scalar conversion.
inline u32x4 float_to_bfloat16_lanes(f32x4 f) {
  const u32x4 x = as_u(f);
  const u32x4 rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
  return select(f != f, splat_u(0x7FC0u), rounded);
}

#if defined(CORE_OPS_VEC_NEON) && defined(__aarch64__)
// aarch64 converts halves in one instruction per four lanes (FCVTL / FCVTN, part of
// ARMv8-A), the one torch's scalar Half conversion compiles to there: a NaN keeps its
// sign and top payload bits, quieted, as F16C's does.
inline f32x4 half_low_to_float(u16x8 x) { return f32x4(vcvt_f32_f16(vget_low_f16(vreinterpretq_f16_u16(uint16x8_t(x))))); }
inline f32x4 half_high_to_float(u16x8 x) { return f32x4(vcvt_high_f32_f16(vreinterpretq_f16_u16(uint16x8_t(x)))); }
inline u16x8 float_to_half_pair(f32x4 a, f32x4 b) {
  return u16x8(vreinterpretq_u16_f16(vcvt_high_f16_f32(vcvt_f16_f32(float32x4_t(a)), float32x4_t(b))));
}

inline std::tuple<Vectorized<float>, Vectorized<float>> half_to_float(const Vectorized<torch::headeronly::Half>& v) {
  return {Vectorized<float>(half_low_to_float(v.h.lo), half_high_to_float(v.h.lo)),
          Vectorized<float>(half_low_to_float(v.h.hi), half_high_to_float(v.h.hi))};
}

inline Vectorized<torch::headeronly::Half> float_to_half(const Vectorized<float>& a, const Vectorized<float>& b) {
  return {float_to_half_pair(a.h.lo, a.h.hi), float_to_half_pair(b.h.lo, b.h.hi)};
}
#else
inline std::tuple<Vectorized<float>, Vectorized<float>> half_to_float(const Vectorized<torch::headeronly::Half>& v) {
  return {Vectorized<float>(half_lanes_to_float(widen_low(v.h.lo)), half_lanes_to_float(widen_high(v.h.lo))),
          Vectorized<float>(half_lanes_to_float(widen_low(v.h.hi)), half_lanes_to_float(widen_high(v.h.hi)))};
}

inline Vectorized<torch::headeronly::Half> float_to_half(const Vectorized<float>& a, const Vectorized<float>& b) {
  return {narrow(float_to_half_lanes(a.h.lo), float_to_half_lanes(a.h.hi)),
          narrow(float_to_half_lanes(b.h.lo), float_to_half_lanes(b.h.hi))};
}
#endif

inline std::tuple<Vectorized<float>, Vectorized<float>> bfloat16_to_float(const Vectorized<torch::headeronly::BFloat16>& v) {
  return {Vectorized<float>(bfloat16_lanes_to_float(widen_low(v.h.lo)), bfloat16_lanes_to_float(widen_high(v.h.lo))),
          Vectorized<float>(bfloat16_lanes_to_float(widen_low(v.h.hi)), bfloat16_lanes_to_float(widen_high(v.h.hi)))};
}

inline Vectorized<torch::headeronly::BFloat16> float_to_bfloat16(const Vectorized<float>& a, const Vectorized<float>& b) {
  return {narrow(float_to_bfloat16_lanes(a.h.lo), float_to_bfloat16_lanes(a.h.hi)),
          narrow(float_to_bfloat16_lanes(b.h.lo), float_to_bfloat16_lanes(b.h.hi))};
}

// at::vec's DEFAULT level folds one lane after another (vec_reduce_all in vec.h).
constexpr bool kTreeReduce = false;

}  // namespace vec
CORE_OPS_CPU_END
