// The AVX-512 level of vec.h (Note [Vector levels]): 16 float / int32 lanes in one
// __m512 / __m512i, 32 half / bfloat16 lanes in one __m512i. Include vec.h, not this.
#pragma once

#include <immintrin.h>

CORE_OPS_CPU_BEGIN
namespace vec {

// A mask register as a vector: all ones where set.
inline __m512 mask_floats(__mmask16 m) { return _mm512_castsi512_ps(_mm512_movm_epi32(m)); }
inline __mmask16 lanes_below(int64_t count) {
  return count >= 16 ? __mmask16(0xFFFF) : count <= 0 ? __mmask16(0) : __mmask16((1u << count) - 1);
}

template <>
class Vectorized<float> {
  __m512 v_;

 public:
  using value_type = float;
  static constexpr int size() { return 16; }
  Vectorized() = default;
  Vectorized(__m512 v) : v_(v) {}
  Vectorized(float x) : v_(_mm512_set1_ps(x)) {}
  operator __m512() const { return v_; }

  static Vectorized loadu(const void* p) { return _mm512_loadu_ps(p); }
  // The first `count` lanes from p, the others zero; reads nothing past them.
  static Vectorized loadu(const void* p, int64_t count) { return _mm512_maskz_loadu_ps(lanes_below(count), p); }
  void store(void* p) const { _mm512_storeu_ps(p, v_); }
  void store(void* p, int64_t count) const { _mm512_mask_storeu_ps(p, lanes_below(count), v_); }

  Vectorized abs() const { return _mm512_andnot_ps(_mm512_set1_ps(-0.f), v_); }
  Vectorized neg() const { return _mm512_xor_ps(_mm512_set1_ps(-0.f), v_); }
  Vectorized sqrt() const { return _mm512_sqrt_ps(v_); }
  Vectorized operator-() const { return neg(); }

  Vectorized operator==(const Vectorized& o) const { return mask_floats(_mm512_cmp_ps_mask(v_, o.v_, _CMP_EQ_OQ)); }
  Vectorized operator!=(const Vectorized& o) const { return mask_floats(_mm512_cmp_ps_mask(v_, o.v_, _CMP_NEQ_UQ)); }
  Vectorized operator<(const Vectorized& o) const { return mask_floats(_mm512_cmp_ps_mask(v_, o.v_, _CMP_LT_OQ)); }
  Vectorized operator<=(const Vectorized& o) const { return mask_floats(_mm512_cmp_ps_mask(v_, o.v_, _CMP_LE_OQ)); }
  Vectorized operator>(const Vectorized& o) const { return mask_floats(_mm512_cmp_ps_mask(v_, o.v_, _CMP_GT_OQ)); }
  Vectorized operator>=(const Vectorized& o) const { return mask_floats(_mm512_cmp_ps_mask(v_, o.v_, _CMP_GE_OQ)); }

  static Vectorized blendv(const Vectorized& a, const Vectorized& b, const Vectorized& mask) {
    return _mm512_mask_blend_ps(_mm512_movepi32_mask(_mm512_castps_si512(mask.v_)), a.v_, b.v_);
  }
};

inline Vectorized<float> operator+(const Vectorized<float>& a, const Vectorized<float>& b) { return _mm512_add_ps(a, b); }
inline Vectorized<float> operator-(const Vectorized<float>& a, const Vectorized<float>& b) { return _mm512_sub_ps(a, b); }
inline Vectorized<float> operator*(const Vectorized<float>& a, const Vectorized<float>& b) { return _mm512_mul_ps(a, b); }
inline Vectorized<float> operator/(const Vectorized<float>& a, const Vectorized<float>& b) { return _mm512_div_ps(a, b); }
inline Vectorized<float> operator&(const Vectorized<float>& a, const Vectorized<float>& b) { return _mm512_and_ps(a, b); }
inline Vectorized<float> operator|(const Vectorized<float>& a, const Vectorized<float>& b) { return _mm512_or_ps(a, b); }
inline Vectorized<float> operator^(const Vectorized<float>& a, const Vectorized<float>& b) { return _mm512_xor_ps(a, b); }
inline Vectorized<float> operator~(const Vectorized<float>& a) {
  return _mm512_xor_ps(a, _mm512_castsi512_ps(_mm512_set1_epi32(-1)));
}

inline Vectorized<float> fmadd(const Vectorized<float>& a, const Vectorized<float>& b, const Vectorized<float>& c) {
  return _mm512_fmadd_ps(a, b, c);
}

// IEEE 754-2019 maximum / minimum: a NaN in either lane gives a NaN (all ones).
inline Vectorized<float> maximum(const Vectorized<float>& a, const Vectorized<float>& b) {
  return _mm512_or_ps(_mm512_max_ps(a, b), mask_floats(_mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q)));
}
inline Vectorized<float> minimum(const Vectorized<float>& a, const Vectorized<float>& b) {
  return _mm512_or_ps(_mm512_min_ps(a, b), mask_floats(_mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q)));
}

template <>
class Vectorized<int32_t> {
  __m512i v_;

 public:
  using value_type = int32_t;
  static constexpr int size() { return 16; }
  Vectorized() = default;
  Vectorized(__m512i v) : v_(v) {}
  Vectorized(int32_t x) : v_(_mm512_set1_epi32(x)) {}
  operator __m512i() const { return v_; }

  static Vectorized loadu(const void* p) { return _mm512_loadu_si512(p); }
  static Vectorized loadu(const void* p, int64_t count) { return _mm512_maskz_loadu_epi32(lanes_below(count), p); }
  void store(void* p) const { _mm512_storeu_si512(p, v_); }
  void store(void* p, int64_t count) const { _mm512_mask_storeu_epi32(p, lanes_below(count), v_); }

  Vectorized abs() const { return _mm512_abs_epi32(v_); }
  Vectorized neg() const { return _mm512_sub_epi32(_mm512_setzero_si512(), v_); }
  Vectorized operator-() const { return neg(); }

  Vectorized operator==(const Vectorized& o) const { return _mm512_movm_epi32(_mm512_cmpeq_epi32_mask(v_, o.v_)); }
  Vectorized operator!=(const Vectorized& o) const { return _mm512_movm_epi32(_mm512_cmpneq_epi32_mask(v_, o.v_)); }
  Vectorized operator<(const Vectorized& o) const { return _mm512_movm_epi32(_mm512_cmplt_epi32_mask(v_, o.v_)); }
  Vectorized operator<=(const Vectorized& o) const { return _mm512_movm_epi32(_mm512_cmple_epi32_mask(v_, o.v_)); }
  Vectorized operator>(const Vectorized& o) const { return _mm512_movm_epi32(_mm512_cmpgt_epi32_mask(v_, o.v_)); }
  Vectorized operator>=(const Vectorized& o) const { return _mm512_movm_epi32(_mm512_cmpge_epi32_mask(v_, o.v_)); }

  static Vectorized blendv(const Vectorized& a, const Vectorized& b, const Vectorized& mask) {
    return _mm512_mask_blend_epi32(_mm512_movepi32_mask(mask.v_), a.v_, b.v_);
  }
};

inline Vectorized<int32_t> operator+(const Vectorized<int32_t>& a, const Vectorized<int32_t>& b) { return _mm512_add_epi32(a, b); }
inline Vectorized<int32_t> operator-(const Vectorized<int32_t>& a, const Vectorized<int32_t>& b) { return _mm512_sub_epi32(a, b); }
inline Vectorized<int32_t> operator*(const Vectorized<int32_t>& a, const Vectorized<int32_t>& b) { return _mm512_mullo_epi32(a, b); }
inline Vectorized<int32_t> operator&(const Vectorized<int32_t>& a, const Vectorized<int32_t>& b) { return _mm512_and_si512(a, b); }
inline Vectorized<int32_t> operator|(const Vectorized<int32_t>& a, const Vectorized<int32_t>& b) { return _mm512_or_si512(a, b); }
inline Vectorized<int32_t> operator^(const Vectorized<int32_t>& a, const Vectorized<int32_t>& b) { return _mm512_xor_si512(a, b); }
inline Vectorized<int32_t> operator~(const Vectorized<int32_t>& a) { return _mm512_xor_si512(a, _mm512_set1_epi32(-1)); }
// Shifts by each lane's count: past 31 (or negative), << gives 0 and >> the sign.
inline Vectorized<int32_t> operator<<(const Vectorized<int32_t>& a, const Vectorized<int32_t>& n) { return _mm512_sllv_epi32(a, n); }
inline Vectorized<int32_t> operator>>(const Vectorized<int32_t>& a, const Vectorized<int32_t>& n) { return _mm512_srav_epi32(a, n); }

inline Vectorized<int32_t> maximum(const Vectorized<int32_t>& a, const Vectorized<int32_t>& b) { return _mm512_max_epi32(a, b); }
inline Vectorized<int32_t> minimum(const Vectorized<int32_t>& a, const Vectorized<int32_t>& b) { return _mm512_min_epi32(a, b); }

inline Vectorized<int32_t> bits_of(const Vectorized<float>& v) { return _mm512_castps_si512(v); }
inline Vectorized<float> floats_of(const Vectorized<int32_t>& v) { return _mm512_castsi512_ps(v); }

// Lane i of the result is the T at byte offset index[i] * scale from base.
template <int64_t scale = 1>
inline Vectorized<float> gather(const float* base, const Vectorized<int32_t>& index) {
  static_assert(scale == 1 || scale == 2 || scale == 4 || scale == 8, "gather's scale is 1, 2, 4 or 8");
  return _mm512_i32gather_ps(index, base, scale);
}
template <int64_t scale = 1>
inline Vectorized<int32_t> gather(const int32_t* base, const Vectorized<int32_t>& index) {
  static_assert(scale == 1 || scale == 2 || scale == 4 || scale == 8, "gather's scale is 1, 2, 4 or 8");
  return _mm512_i32gather_epi32(index, base, scale);
}

// 32 half or bfloat16 lanes (their bits).
template <typename T>
class Vectorized {
  static_assert(std::is_same_v<T, torch::headeronly::Half> || std::is_same_v<T, torch::headeronly::BFloat16>,
                "vec::Vectorized holds float, int32_t, Half or BFloat16");
  __m512i v_;

 public:
  using value_type = T;
  static constexpr int size() { return 32; }
  Vectorized() = default;
  Vectorized(__m512i v) : v_(v) {}
  operator __m512i() const { return v_; }

  static Vectorized loadu(const void* p) { return _mm512_loadu_si512(p); }
  static Vectorized loadu(const void* p, int64_t count) { return _mm512_maskz_loadu_epi16(lanes16_below(count), p); }
  void store(void* p) const { _mm512_storeu_si512(p, v_); }
  void store(void* p, int64_t count) const { _mm512_mask_storeu_epi16(p, lanes16_below(count), v_); }

 private:
  static __mmask32 lanes16_below(int64_t count) {
    return count >= 32 ? __mmask32(0xFFFFFFFFu) : count <= 0 ? __mmask32(0) : __mmask32((1u << count) - 1);
  }
};

inline std::tuple<Vectorized<float>, Vectorized<float>> half_to_float(const Vectorized<torch::headeronly::Half>& v) {
  const __m512i x = v;
  return {_mm512_cvtph_ps(_mm512_extracti32x8_epi32(x, 0)), _mm512_cvtph_ps(_mm512_extracti32x8_epi32(x, 1))};
}

inline Vectorized<torch::headeronly::Half> float_to_half(const Vectorized<float>& a, const Vectorized<float>& b) {
  const __m256i lo = _mm512_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256i hi = _mm512_cvtps_ph(b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

inline std::tuple<Vectorized<float>, Vectorized<float>> bfloat16_to_float(const Vectorized<torch::headeronly::BFloat16>& v) {
  const __m512i x = v;
  const __m512i lo = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti32x8_epi32(x, 0)), 16);
  const __m512i hi = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti32x8_epi32(x, 1)), 16);
  return {_mm512_castsi512_ps(lo), _mm512_castsi512_ps(hi)};
}

// Round to nearest, ties to even: add 0x7FFF plus the kept part's lowest bit, keep the
// top 16 bits. A NaN becomes 0xFFFF (Note [Vector results as at::vec]).
inline __m512i bfloat16_bits(const __m512 f) {
  const __m512i x = _mm512_castps_si512(f);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)), x), 16);
  return _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(f, f, _CMP_ORD_Q), _mm512_set1_epi32(0xFFFF), rounded);
}

inline Vectorized<torch::headeronly::BFloat16> float_to_bfloat16(const Vectorized<float>& a, const Vectorized<float>& b) {
  // packus interleaves the two inputs' 128-bit quarters; the permute puts them in order.
  const __m512i packed = _mm512_packus_epi32(bfloat16_bits(a), bfloat16_bits(b));
  return _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), packed);
}

constexpr bool kTreeReduce = true;

// at::vec's order: lanes i and i + 8, then i and i + 4, i + 2, i + 1.
template <typename Op>
inline float reduce_tree(const Op& op, const Vectorized<float>& acc) {
  Vectorized<float> v = acc;
  Vectorized<float> w = _mm512_shuffle_f32x4(v, v, 0x4E);
  v = op(v, w);
  w = _mm512_shuffle_f32x4(v, v, 0xB1);
  v = op(v, w);
  w = _mm512_shuffle_ps(v, v, 0x4E);
  v = op(v, w);
  w = _mm512_shuffle_ps(v, v, 0xB1);
  v = op(v, w);
  return _mm512_cvtss_f32(v);
}

}  // namespace vec
CORE_OPS_CPU_END
