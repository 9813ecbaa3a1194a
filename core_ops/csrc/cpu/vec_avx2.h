// The AVX2 level of vec.h (Note [Vector levels]): 8 float / int32 lanes in one
// __m256 / __m256i, 16 half / bfloat16 lanes in one __m256i. Include vec.h, not this.
#pragma once

#include <immintrin.h>

CORE_OPS_CPU_BEGIN
namespace vec {

template <>
class Vectorized<float> {
  __m256 v_;

 public:
  using value_type = float;
  static constexpr int size() { return 8; }
  Vectorized() = default;
  Vectorized(__m256 v) : v_(v) {}
  Vectorized(float x) : v_(_mm256_set1_ps(x)) {}
  operator __m256() const { return v_; }

  static Vectorized loadu(const void* p) { return _mm256_loadu_ps(static_cast<const float*>(p)); }
  // The first `count` lanes from p, the others zero; reads nothing past them.
  static Vectorized loadu(const void* p, int64_t count) {
    return _mm256_maskload_ps(static_cast<const float*>(p), lanes_below(count));
  }
  void store(void* p) const { _mm256_storeu_ps(static_cast<float*>(p), v_); }
  void store(void* p, int64_t count) const { _mm256_maskstore_ps(static_cast<float*>(p), lanes_below(count), v_); }

  Vectorized abs() const { return _mm256_andnot_ps(_mm256_set1_ps(-0.f), v_); }
  Vectorized neg() const { return _mm256_xor_ps(_mm256_set1_ps(-0.f), v_); }
  Vectorized sqrt() const { return _mm256_sqrt_ps(v_); }
  Vectorized operator-() const { return neg(); }

  Vectorized operator==(const Vectorized& o) const { return _mm256_cmp_ps(v_, o.v_, _CMP_EQ_OQ); }
  Vectorized operator!=(const Vectorized& o) const { return _mm256_cmp_ps(v_, o.v_, _CMP_NEQ_UQ); }
  Vectorized operator<(const Vectorized& o) const { return _mm256_cmp_ps(v_, o.v_, _CMP_LT_OQ); }
  Vectorized operator<=(const Vectorized& o) const { return _mm256_cmp_ps(v_, o.v_, _CMP_LE_OQ); }
  Vectorized operator>(const Vectorized& o) const { return _mm256_cmp_ps(v_, o.v_, _CMP_GT_OQ); }
  Vectorized operator>=(const Vectorized& o) const { return _mm256_cmp_ps(v_, o.v_, _CMP_GE_OQ); }

  static Vectorized blendv(const Vectorized& a, const Vectorized& b, const Vectorized& mask) {
    return _mm256_blendv_ps(a.v_, b.v_, mask.v_);
  }

 private:
  static __m256i lanes_below(int64_t count) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(count)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
};

inline Vectorized<float> operator+(const Vectorized<float>& a, const Vectorized<float>& b) { return _mm256_add_ps(a, b); }
inline Vectorized<float> operator-(const Vectorized<float>& a, const Vectorized<float>& b) { return _mm256_sub_ps(a, b); }
inline Vectorized<float> operator*(const Vectorized<float>& a, const Vectorized<float>& b) { return _mm256_mul_ps(a, b); }
inline Vectorized<float> operator/(const Vectorized<float>& a, const Vectorized<float>& b) { return _mm256_div_ps(a, b); }
inline Vectorized<float> operator&(const Vectorized<float>& a, const Vectorized<float>& b) { return _mm256_and_ps(a, b); }
inline Vectorized<float> operator|(const Vectorized<float>& a, const Vectorized<float>& b) { return _mm256_or_ps(a, b); }
inline Vectorized<float> operator^(const Vectorized<float>& a, const Vectorized<float>& b) { return _mm256_xor_ps(a, b); }
inline Vectorized<float> operator~(const Vectorized<float>& a) {
  return _mm256_xor_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(-1)));
}

inline Vectorized<float> fmadd(const Vectorized<float>& a, const Vectorized<float>& b, const Vectorized<float>& c) {
  return _mm256_fmadd_ps(a, b, c);
}

// IEEE 754-2019 maximum / minimum: a NaN in either lane gives a NaN (all ones).
inline Vectorized<float> maximum(const Vectorized<float>& a, const Vectorized<float>& b) {
  return _mm256_or_ps(_mm256_max_ps(a, b), _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
}
inline Vectorized<float> minimum(const Vectorized<float>& a, const Vectorized<float>& b) {
  return _mm256_or_ps(_mm256_min_ps(a, b), _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
}

template <>
class Vectorized<int32_t> {
  __m256i v_;

 public:
  using value_type = int32_t;
  static constexpr int size() { return 8; }
  Vectorized() = default;
  Vectorized(__m256i v) : v_(v) {}
  Vectorized(int32_t x) : v_(_mm256_set1_epi32(x)) {}
  operator __m256i() const { return v_; }

  static Vectorized loadu(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
  static Vectorized loadu(const void* p, int64_t count) {
    return _mm256_maskload_epi32(static_cast<const int*>(p), lanes_below(count));
  }
  void store(void* p) const { _mm256_storeu_si256(static_cast<__m256i*>(p), v_); }
  void store(void* p, int64_t count) const { _mm256_maskstore_epi32(static_cast<int*>(p), lanes_below(count), v_); }

  Vectorized abs() const { return _mm256_abs_epi32(v_); }
  Vectorized neg() const { return _mm256_sub_epi32(_mm256_setzero_si256(), v_); }
  Vectorized operator-() const { return neg(); }

  Vectorized operator==(const Vectorized& o) const { return _mm256_cmpeq_epi32(v_, o.v_); }
  Vectorized operator!=(const Vectorized& o) const { return _mm256_xor_si256(_mm256_cmpeq_epi32(v_, o.v_), ones()); }
  Vectorized operator<(const Vectorized& o) const { return _mm256_cmpgt_epi32(o.v_, v_); }
  Vectorized operator<=(const Vectorized& o) const { return _mm256_xor_si256(_mm256_cmpgt_epi32(v_, o.v_), ones()); }
  Vectorized operator>(const Vectorized& o) const { return _mm256_cmpgt_epi32(v_, o.v_); }
  Vectorized operator>=(const Vectorized& o) const { return _mm256_xor_si256(_mm256_cmpgt_epi32(o.v_, v_), ones()); }

  static Vectorized blendv(const Vectorized& a, const Vectorized& b, const Vectorized& mask) {
    return _mm256_blendv_epi8(a.v_, b.v_, mask.v_);
  }

 private:
  static __m256i ones() { return _mm256_set1_epi32(-1); }
  static __m256i lanes_below(int64_t count) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(count)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
};

inline Vectorized<int32_t> operator+(const Vectorized<int32_t>& a, const Vectorized<int32_t>& b) { return _mm256_add_epi32(a, b); }
inline Vectorized<int32_t> operator-(const Vectorized<int32_t>& a, const Vectorized<int32_t>& b) { return _mm256_sub_epi32(a, b); }
inline Vectorized<int32_t> operator*(const Vectorized<int32_t>& a, const Vectorized<int32_t>& b) { return _mm256_mullo_epi32(a, b); }
inline Vectorized<int32_t> operator&(const Vectorized<int32_t>& a, const Vectorized<int32_t>& b) { return _mm256_and_si256(a, b); }
inline Vectorized<int32_t> operator|(const Vectorized<int32_t>& a, const Vectorized<int32_t>& b) { return _mm256_or_si256(a, b); }
inline Vectorized<int32_t> operator^(const Vectorized<int32_t>& a, const Vectorized<int32_t>& b) { return _mm256_xor_si256(a, b); }
inline Vectorized<int32_t> operator~(const Vectorized<int32_t>& a) { return _mm256_xor_si256(a, _mm256_set1_epi32(-1)); }
// Shifts by each lane's count: past 31 (or negative), << gives 0 and >> the sign.
inline Vectorized<int32_t> operator<<(const Vectorized<int32_t>& a, const Vectorized<int32_t>& n) { return _mm256_sllv_epi32(a, n); }
inline Vectorized<int32_t> operator>>(const Vectorized<int32_t>& a, const Vectorized<int32_t>& n) { return _mm256_srav_epi32(a, n); }

inline Vectorized<int32_t> maximum(const Vectorized<int32_t>& a, const Vectorized<int32_t>& b) { return _mm256_max_epi32(a, b); }
inline Vectorized<int32_t> minimum(const Vectorized<int32_t>& a, const Vectorized<int32_t>& b) { return _mm256_min_epi32(a, b); }

inline Vectorized<int32_t> bits_of(const Vectorized<float>& v) { return _mm256_castps_si256(v); }
inline Vectorized<float> floats_of(const Vectorized<int32_t>& v) { return _mm256_castsi256_ps(v); }

// Lane i of the result is the T at byte offset index[i] * scale from base.
template <int64_t scale = 1>
inline Vectorized<float> gather(const float* base, const Vectorized<int32_t>& index) {
  static_assert(scale == 1 || scale == 2 || scale == 4 || scale == 8, "gather's scale is 1, 2, 4 or 8");
  return _mm256_i32gather_ps(base, index, scale);
}
template <int64_t scale = 1>
inline Vectorized<int32_t> gather(const int32_t* base, const Vectorized<int32_t>& index) {
  static_assert(scale == 1 || scale == 2 || scale == 4 || scale == 8, "gather's scale is 1, 2, 4 or 8");
  return _mm256_i32gather_epi32(reinterpret_cast<const int*>(base), index, scale);
}

// 16 half or bfloat16 lanes (their bits).
template <typename T>
class Vectorized {
  static_assert(std::is_same_v<T, torch::headeronly::Half> || std::is_same_v<T, torch::headeronly::BFloat16>,
                "vec::Vectorized holds float, int32_t, Half or BFloat16");
  __m256i v_;

 public:
  using value_type = T;
  static constexpr int size() { return 16; }
  Vectorized() = default;
  Vectorized(__m256i v) : v_(v) {}
  operator __m256i() const { return v_; }

  static Vectorized loadu(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
  static Vectorized loadu(const void* p, int64_t count) {
    __m256i out = _mm256_setzero_si256();
    std::memcpy(&out, p, static_cast<size_t>(count) * sizeof(T));
    return out;
  }
  void store(void* p) const { _mm256_storeu_si256(static_cast<__m256i*>(p), v_); }
  void store(void* p, int64_t count) const { std::memcpy(p, &v_, static_cast<size_t>(count) * sizeof(T)); }
};

inline std::tuple<Vectorized<float>, Vectorized<float>> half_to_float(const Vectorized<torch::headeronly::Half>& v) {
  const __m256i x = v;
  return {_mm256_cvtph_ps(_mm256_castsi256_si128(x)), _mm256_cvtph_ps(_mm256_extracti128_si256(x, 1))};
}

inline Vectorized<torch::headeronly::Half> float_to_half(const Vectorized<float>& a, const Vectorized<float>& b) {
  const __m128i lo = _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m128i hi = _mm256_cvtps_ph(b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

inline std::tuple<Vectorized<float>, Vectorized<float>> bfloat16_to_float(const Vectorized<torch::headeronly::BFloat16>& v) {
  const __m256i x = v;
  const __m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(x)), 16);
  const __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(x, 1)), 16);
  return {_mm256_castsi256_ps(lo), _mm256_castsi256_ps(hi)};
}

// Round to nearest, ties to even: add 0x7FFF plus the kept part's lowest bit, keep the
// top 16 bits. A NaN becomes 0xFFFF (Note [Vector results as at::vec]).
inline __m256i bfloat16_bits(const __m256 f) {
  const __m256i x = _mm256_castps_si256(f);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)), x), 16);
  const __m256i ordered = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_ORD_Q));
  return _mm256_blendv_epi8(_mm256_set1_epi32(0xFFFF), rounded, ordered);
}

inline Vectorized<torch::headeronly::BFloat16> float_to_bfloat16(const Vectorized<float>& a, const Vectorized<float>& b) {
  // packus interleaves the two inputs' 128-bit halves; the permute puts them in order.
  const __m256i packed = _mm256_packus_epi32(bfloat16_bits(a), bfloat16_bits(b));
  return _mm256_permute4x64_epi64(packed, 0xD8);
}

constexpr bool kTreeReduce = true;

// at::vec's order: lanes i and i + 4, then i and i + 2, then i and i + 1.
template <typename Op>
inline float reduce_tree(const Op& op, const Vectorized<float>& acc) {
  Vectorized<float> v = acc;
  Vectorized<float> w = _mm256_permute2f128_ps(v, v, 0x1);
  v = op(v, w);
  w = _mm256_shuffle_ps(v, v, 0x4E);
  v = op(v, w);
  w = _mm256_shuffle_ps(v, v, 0xB1);
  v = op(v, w);
  return _mm256_cvtss_f32(v);
}

}  // namespace vec
CORE_OPS_CPU_END
