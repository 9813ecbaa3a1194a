// CPU kernel of fused_adam_compact_: Adam's math (core_ops/adam_math.h) on compact state
// (core_ops/compact_state.h), in one pass over the state (Note [Compact state in one
// pass]): the same adam_math on the same float values as fused_adam_, so a step on
// remainders computes exactly what a step on fp32 masters does.
#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#include <torch/csrc/stable/library.h>

#include <core_ops/adam_math.h>
#include <core_ops/compact_state_args.h>

#include "level.h"
#include "optimizer_step.h"
#include "vec.h"

// The byte widening and narrowing of the codes work on the vectors' registers: the
// instructions of the level vec.h chose (Note [Vector levels]).
#if defined(CORE_OPS_VEC_AVX512) || defined(CORE_OPS_VEC_AVX2)
#include <immintrin.h>
#endif

CORE_OPS_CPU_BEGIN
namespace {

// A map with its midpoints, and the codes of every float by its top 16 bits (a
// bfloat16 pattern) in one int32, so that a vector lane finds its code with one
// gather: bits 0-7 hold the number of midpoints below the pattern's smallest float;
// bits 8-23 a key K such that a float x of the pattern lies above the next midpoint
// iff key(x) > K, key(x) being x's low 16 bits, flipped for a negative x (there a
// larger magnitude is a smaller value); K = 0xFFFF (never exceeded) when no midpoint
// falls inside the pattern. That needs at most one midpoint per pattern: true of the
// dynamic maps, checked here (another map takes code_from's walk). Only magnitudes
// from just below the smallest midpoint's to just above the largest's have entries
// (the codes are constant outside), so a table is ~23 KB and stays in L1.
struct Quantizer {
  std::array<float, kMapSize> map, mid;
  // Byte k of each map value. Not over-aligned: an over-aligned member would make
  // make_unique call C++17's aligned operator new (CXXABI_1.3.11, Note [glibc 2.28]'s floor).
  std::array<std::array<uint8_t, kMapSize>, 4> planes;
  std::vector<int32_t> entry;  // [positive magnitudes, negative magnitudes], `range` each
  int32_t base = 0, range = 0;  // magnitude pattern of entry 0, entries per sign
  bool one_step = true;

  explicit Quantizer(const float* values) {
    std::copy(values, values + kMapSize, map.begin());
    for (int j = 0; j < kMapSize; ++j) {
      for (int k = 0; k < 4; ++k) planes[k][j] = static_cast<uint8_t>(float_bits(map[j]) >> (8 * k));
    }
    for (int j = 0; j < kMapSize; ++j) mid[j] = map_midpoint(values, j);
    int32_t lo_mag = 0x7FFF, hi_mag = 0;
    for (int j = 0; j < kMapSize - 1; ++j) {
      const int32_t mag = (float_bits(mid[j]) >> 16) & 0x7FFF;
      lo_mag = std::min(lo_mag, mag);
      hi_mag = std::max(hi_mag, mag);
    }
    base = std::max(lo_mag - 1, 0);
    range = std::min(hi_mag + 1, 0x7FFF) - base + 1;
    entry.resize(2 * range);
    for (int32_t sign = 0; sign < 2; ++sign) {
      for (int32_t k = 0; k < range; ++k) {
        const uint32_t h = (uint32_t(sign) << 15) | uint32_t(base + k);
        const float lo = bits_float(sign ? (h << 16) | 0xFFFF : h << 16);  // the pattern's smallest float
        const float hi = bits_float(sign ? h << 16 : (h << 16) | 0xFFFF);  // and largest
        const int32_t start = static_cast<int32_t>(std::lower_bound(mid.begin(), mid.end() - 1, lo) - mid.begin());
        const auto last = std::upper_bound(mid.begin(), mid.end() - 1, hi) - mid.begin();  // codes start..last
        one_step = one_step && last - start <= 1;
        uint32_t key = 0xFFFF;
        if (last > start) {
          const uint32_t low = float_bits(mid[start]) & 0xFFFF;
          key = sign ? 0xFFFF - low : low;
        }
        entry[sign * range + k] = start | static_cast<int32_t>(key << 8);
      }
    }
  }

  int32_t index(uint32_t bits) const {
    const int32_t mag = int32_t((bits >> 16) & 0x7FFF) - base;
    return std::min(std::max(mag, 0), range - 1) + (bits >> 31 ? range : 0);
  }

  uint8_t code(float normalized) const {
    if (std::isnan(normalized)) return kMapSize - 1;
    return code_from(normalized, mid.data(), entry[index(float_bits(normalized))] & 0xFF);
  }
};

using iVec = vec::Vectorized<int32_t>;
constexpr int64_t kLanes = fVec::size();

// Lane-wise table reads: one gather instruction at AVX2 / AVX-512.
inline fVec gather_floats(const float* table, const iVec& index) { return vec::gather<sizeof(float)>(table, index); }

inline iVec gather_ints(const int32_t* table, const iVec& index) { return vec::gather<sizeof(int32_t)>(table, index); }

// kLanes codes widened to int32 lanes, and back.
inline iVec load_codes(const uint8_t* p) {
#if defined(CORE_OPS_VEC_AVX512)
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#elif defined(CORE_OPS_VEC_AVX2)
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
#else
  alignas(64) int32_t wide[kLanes];
  for (int64_t j = 0; j < kLanes; ++j) wide[j] = p[j];
  return iVec::loadu(wide);
#endif
}

inline void store_codes(uint8_t* p, const iVec& codes) {
#if defined(CORE_OPS_VEC_AVX512)
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(codes));
#else
  alignas(64) int32_t wide[kLanes];
  codes.store(wide);
  for (int64_t j = 0; j < kLanes; ++j) p[j] = static_cast<uint8_t>(wide[j]);
#endif
}

inline float max_abs(const fVec& top) {
  return vec::vec_reduce_all<float>([](fVec& a, fVec& b) { return vec::maximum(a, b); }, top);
}

// Note [Byte-plane decoding]: with AVX-512 VBMI (Ice Lake, Zen 4 and later) a map of
// 256 floats is four planes of 256 bytes, each looked up for 64 codes at once by two
// two-register byte permutes and a blend on the code's top bit; unpacking the four
// planes' bytes into floats then needs the codes in an order that the unpacks' 128-bit
// lanes undo (kUnpackOrder). Twice the speed of 16-lane gathers on the AMD EPYC
// measured (0.19 against 0.38 ns a code, one core), and the same floats: each is the
// map value's four bytes. Other AVX-512 CPUs keep the gathers.
#if defined(CORE_OPS_VEC_AVX512) && defined(__GNUC__)
#define CORE_OPS_BYTE_PLANES 1
__attribute__((target("avx512vbmi"))) void dequantize_planes(const Quantizer& q, const uint8_t* codes, float scale,
                                                             float* out) {
  // After the unpacks, float f of the result's output vector j sits where code
  // 16 * j + f should have been read: byte 16 * lane + 4 * j + e, f = 4 * lane + e.
  alignas(64) static const std::array<uint8_t, 64> kUnpackOrder = [] {
    std::array<uint8_t, 64> order{};
    for (int lane = 0; lane < 4; ++lane)
      for (int j = 0; j < 4; ++j)
        for (int e = 0; e < 4; ++e) order[16 * lane + 4 * j + e] = static_cast<uint8_t>(16 * j + 4 * lane + e);
    return order;
  }();
  const __m512i order = _mm512_load_si512(kUnpackOrder.data());
  __m512i plane[4][4];
  for (int k = 0; k < 4; ++k)
    for (int j = 0; j < 4; ++j) plane[k][j] = _mm512_loadu_si512(q.planes[k].data() + 64 * j);
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < kQuantBlock; i += 64) {
    const __m512i c = _mm512_permutexvar_epi8(order, _mm512_loadu_si512(codes + i));
    const __mmask64 high = _mm512_movepi8_mask(c);
    __m512i b[4];
    for (int k = 0; k < 4; ++k) {
      b[k] = _mm512_mask_blend_epi8(high, _mm512_permutex2var_epi8(plane[k][0], c, plane[k][1]),
                                    _mm512_permutex2var_epi8(plane[k][2], c, plane[k][3]));
    }
    const __m512i lo01 = _mm512_unpacklo_epi8(b[0], b[1]), hi01 = _mm512_unpackhi_epi8(b[0], b[1]);
    const __m512i lo23 = _mm512_unpacklo_epi8(b[2], b[3]), hi23 = _mm512_unpackhi_epi8(b[2], b[3]);
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_castsi512_ps(_mm512_unpacklo_epi16(lo01, lo23)), vscale));
    _mm512_storeu_ps(out + i + 16, _mm512_mul_ps(_mm512_castsi512_ps(_mm512_unpackhi_epi16(lo01, lo23)), vscale));
    _mm512_storeu_ps(out + i + 32, _mm512_mul_ps(_mm512_castsi512_ps(_mm512_unpacklo_epi16(hi01, hi23)), vscale));
    _mm512_storeu_ps(out + i + 48, _mm512_mul_ps(_mm512_castsi512_ps(_mm512_unpackhi_epi16(hi01, hi23)), vscale));
  }
}

const bool kByteDecode = __builtin_cpu_supports("avx512vbmi");
#endif

// out[i] = map[codes[i]] * scale for a block.
void dequantize_block(const Quantizer& q, const uint8_t* codes, float scale, int64_t n, float* out) {
#if defined(CORE_OPS_BYTE_PLANES)
  if (kByteDecode && n == kQuantBlock) return dequantize_planes(q, codes, scale, out);
#endif
  const fVec vscale(scale);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) (gather_floats(q.map.data(), load_codes(codes + i)) * vscale).store(out + i);
  for (; i < n; ++i) out[i] = q.map[codes[i]] * scale;
}

// The block's absolute maximum (a NaN if any element is one, as the reference's
// amax), then each element's code; `known_top` when the caller has the maximum.
float quantize_block(const Quantizer& q, const float* in, int64_t n, uint8_t* codes, const float* known_top = nullptr) {
  float top;
  int64_t i = 0;
  if (known_top != nullptr) {
    top = *known_top;
  } else {
    fVec vtop(0.f);
    for (; i + kLanes <= n; i += kLanes) vtop = vec::maximum(vtop, fVec::loadu(in + i).abs());
    top = max_abs(vtop);
    for (; i < n; ++i) {
      const float a = std::fabs(in[i]);
      if (a > top || std::isnan(a)) top = a;
    }
  }
  const float inv = inverse_absmax(top);
  i = 0;
  if (q.one_step) {
    const fVec vinv(inv);
    const iVec low8(0xFF), low16(0xFFFF), mag16(0x7FFF), one(1), zero(0), by8(8), by16(16), by31(31);
    const iVec base(q.base), last(q.range - 1), range(q.range);
    for (; i + kLanes <= n; i += kLanes) {
      const fVec x = fVec::loadu(in + i) * vinv;
      const iVec bits = vec::cast<int32_t>(x);
      const iVec negative = bits >> by31;  // all ones for a negative x
      const iVec mag = vec::minimum(vec::maximum(((bits >> by16) & mag16) - base, zero), last);
      const iVec e = gather_ints(q.entry.data(), mag + (negative & range));
      const iVec key = (bits & low16) ^ (negative & low16);
      const iVec above = vec::cast<int32_t>(key > ((e >> by8) & low16)) & one;
      // A NaN lane: the reference's code is the last.
      const iVec nan = vec::cast<int32_t>(x != x);
      store_codes(codes + i, (((e & low8) + above) & ~nan) | (nan & low8));
    }
  }
  for (; i < n; ++i) codes[i] = q.code(in[i] * inv);
  return top;
}

// Built once per distinct map (the optimizers use two) and kept: 66 KB each.
const Quantizer& quantizer_for(const Tensor& map) {
  static std::mutex lock;
  static std::vector<std::unique_ptr<Quantizer>> built;
  const float* values = data<const float>(map);
  std::lock_guard<std::mutex> guard(lock);
  for (const auto& q : built) {
    if (std::equal(q->map.begin(), q->map.end(), values)) return *q;
  }
  built.push_back(std::make_unique<Quantizer>(values));
  return *built.back();
}

// Note [Compact state in one pass]: a step on compact state is fused_adam_'s loop with
// other loads and stores around the same adam_math: weights from the param, an fp32
// master or the param joined with its remainder; moments from float32 or bfloat16
// state, read and written where they lie. Joining and splitting a remainder is integer
// arithmetic in the vector lanes, beside the bfloat16 rounding of the param, so every
// byte is read and written once. Only 8-bit moments pass through a block's float
// buffers: their codes are decoded into them before the loop, and the loop's new
// moments coded from them after it, as coding needs the block's new maximum.

// 2 * kLanes int16 values widened to two vectors of int32 lanes, and back: remainders,
// and a bfloat16 param's bits sign-extended (each value within the int16 range).
inline void load_int16s(const int16_t* p, iVec& a, iVec& b) {
#if defined(CORE_OPS_VEC_AVX512)
  a = _mm512_cvtepi16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  b = _mm512_cvtepi16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + kLanes)));
#elif defined(CORE_OPS_VEC_AVX2)
  a = _mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  b = _mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kLanes)));
#else
  alignas(64) int32_t wide[2 * kLanes];
  for (int64_t j = 0; j < 2 * kLanes; ++j) wide[j] = p[j];
  a = iVec::loadu(wide);
  b = iVec::loadu(wide + kLanes);
#endif
}

inline void store_int16s(int16_t* p, const iVec& a, const iVec& b) {
#if defined(CORE_OPS_VEC_AVX512)
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(a));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + kLanes), _mm512_cvtepi32_epi16(b));
#elif defined(CORE_OPS_VEC_AVX2)
  // packs interleaves the inputs' 128-bit halves; the permute puts them in order.
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8));
#else
  alignas(64) int32_t wide[2 * kLanes];
  a.store(wide);
  b.store(wide + kLanes);
  for (int64_t j = 0; j < 2 * kLanes; ++j) p[j] = static_cast<int16_t>(wide[j]);
#endif
}

// join_master in the lanes: a bfloat16 param loaded as float is its bits shifted up 16.
inline fVec join_lanes(const fVec& param, const iVec& remainder) {
  return vec::cast<float>(vec::cast<int32_t>(param) + remainder);
}

// The bits store2 gives a NaN at this level (0xFFFF at AVX2 / AVX-512, 0x7FC0 at the
// x86-64 baseline: Note [Vector results as at::vec]), sign-extended.
inline int32_t nan_param_bits() {
  static const int32_t bits = [] {
    std::array<BFloat16, kWidth> out;
    const fVec nan(std::numeric_limits<float>::quiet_NaN());
    store2(out.data(), nan, nan);
    return static_cast<int32_t>(static_cast<int16_t>(out[0].x));
  }();
  return bits;
}

// split_master in the lanes: the bits of the master's bfloat16 rounding (nearest, ties
// to even, a NaN `nan_bits`: what store2 writes), sign-extended, and its remainder
// clamped to +-0x7FFF (Note [Master remainders]'s tie), 0 for a NaN. Both go out
// through store_int16s' narrowing.
inline void split_lanes(const fVec& master, const iVec& nan_bits, iVec& param, iVec& remainder) {
  const iVec bits = vec::cast<int32_t>(master);
  const iVec nan = vec::cast<int32_t>(master != master);
  const iVec lsb = (bits >> iVec(16)) & iVec(1);
  const iVec rounded = (bits + iVec(0x7FFF) + lsb) & iVec(static_cast<int32_t>(0xFFFF0000u));
  param = iVec::blendv(rounded >> iVec(16), nan_bits, nan);
  remainder = vec::minimum(vec::maximum(bits - rounded, iVec(-0x7FFF)), iVec(0x7FFF)) & ~nan;
}

// One tensor's pointers at the first element of a range; moment_t is float (float32
// state, or the block buffers of 8-bit moments) or BFloat16.
template <typename param_t, typename moment_t>
struct CompactLanes {
  param_t* param;
  param_t* grad;
  float* master;       // WeightKind::kMaster
  int16_t* remainder;  // WeightKind::kRemainder
  moment_t* exp_avg;
  moment_t* exp_avg_sq;

  CompactLanes at(int64_t i) const {
    return {param + i, grad + i, master ? master + i : nullptr, remainder ? remainder + i : nullptr, exp_avg + i,
            exp_avg_sq + i};
  }
};

// Adam over n elements of one tensor (Note [Compact state in one pass]); with
// kMaxima, also the new moments' absolute maxima (a NaN if any is one, as the
// reference's amax), taken in the loop so that coding needs no pass of its own.
template <WeightKind kWeights, bool kAdamW, bool kUnscale, bool kMaxima = false, typename param_t, typename moment_t>
void compact_range(const CompactLanes<param_t, moment_t>& t, int64_t n, const AdamCoeffs<float>& c,
                   const GradReader<float>& grads, float* maxima = nullptr) {
  fVec m_top(0.f), v_top(0.f);
  static_assert(kWeights != WeightKind::kRemainder || std::is_same_v<param_t, BFloat16>,
                "remainders are kept for bfloat16 params only");
  const iVec nan_bits(kWeights == WeightKind::kRemainder ? nan_param_bits() : 0);
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) {
    fVec x0, x1, g0, g1, m0, m1, v0, v1, unused;
    if constexpr (kWeights == WeightKind::kMaster) {
      load2(t.master + i, x0, x1);
    } else {
      load2(t.param + i, x0, x1);
    }
    iVec r0, r1;
    if constexpr (kWeights == WeightKind::kRemainder) {
      load_int16s(t.remainder + i, r0, r1);
      x0 = join_lanes(x0, r0);
      x1 = join_lanes(x1, r1);
    }
    if constexpr (kUnscale) grads.load(t.grad + i, g0, g1); else load2(t.grad + i, g0, g1);
    load2(t.exp_avg + i, m0, m1);
    load2(t.exp_avg_sq + i, v0, v1);
    adam_math<kAdamW, false>(x0, g0, m0, v0, unused, c);
    adam_math<kAdamW, false>(x1, g1, m1, v1, unused, c);
    store2(t.exp_avg + i, m0, m1);
    store2(t.exp_avg_sq + i, v0, v1);
    if constexpr (kMaxima) {
      m_top = vec::maximum(m_top, vec::maximum(m0.abs(), m1.abs()));
      v_top = vec::maximum(v_top, vec::maximum(v0.abs(), v1.abs()));
    }
    if constexpr (kWeights == WeightKind::kRemainder) {
      iVec p0, p1;
      split_lanes(x0, nan_bits, p0, r0);
      split_lanes(x1, nan_bits, p1, r1);
      store_int16s(reinterpret_cast<int16_t*>(t.param + i), p0, p1);
      store_int16s(t.remainder + i, r0, r1);
    } else {
      store2(t.param + i, x0, x1);
    }
    if constexpr (kWeights == WeightKind::kMaster) store2(t.master + i, x0, x1);
  }
  for (; i < n; ++i) {
    float x;
    if constexpr (kWeights == WeightKind::kMaster) {
      x = t.master[i];
    } else if constexpr (kWeights == WeightKind::kRemainder) {
      x = join_master(t.param[i].x, t.remainder[i]);
    } else {
      x = static_cast<float>(t.param[i]);
    }
    const float g = kUnscale ? grads.load(t.grad + i) : static_cast<float>(t.grad[i]);
    float m = static_cast<float>(t.exp_avg[i]), v = static_cast<float>(t.exp_avg_sq[i]), unused = 0.f;
    adam_math<kAdamW, false>(x, g, m, v, unused, c);
    t.exp_avg[i] = static_cast<moment_t>(m);
    t.exp_avg_sq[i] = static_cast<moment_t>(v);
    t.param[i] = static_cast<param_t>(x);
    if constexpr (kWeights == WeightKind::kMaster) t.master[i] = x;
    if constexpr (kWeights == WeightKind::kRemainder) t.remainder[i] = remainder_of(x, t.param[i].x);
  }
  if constexpr (kMaxima) {
    maxima[0] = max_abs(m_top);
    maxima[1] = max_abs(v_top);
    for (int64_t j = i - n % kWidth; j < n; ++j) {
      for (int k = 0; k < 2; ++k) {
        const float a = std::fabs(static_cast<float>(k == 0 ? t.exp_avg[j] : t.exp_avg_sq[j]));
        if (a > maxima[k] || std::isnan(a)) maxima[k] = a;
      }
    }
  }
}

using Buffer = std::array<float, kQuantBlock>;
static_assert(kChunk % kQuantBlock == 0, "a chunk starts on a block boundary");

// One tensor's state as the step was given it.
struct CompactTensor {
  void* param;
  void* grad;
  void* exp_avg;
  void* exp_avg_sq;
  float* exp_avg_absmax;     // 8-bit moments only
  float* exp_avg_sq_absmax;
  void* master;              // fp32 master or int16 remainder
};

struct CompactMaps {
  const Quantizer* exp_avg;  // 8-bit moments only
  const Quantizer* exp_avg_sq;
};

template <typename param_t, typename moment_t>
CompactLanes<param_t, moment_t> lanes_of(const CompactTensor& t, WeightKind weights, int64_t at) {
  return CompactLanes<param_t, moment_t>{static_cast<param_t*>(t.param),
                                         static_cast<param_t*>(t.grad),
                                         weights == WeightKind::kMaster ? static_cast<float*>(t.master) : nullptr,
                                         weights == WeightKind::kRemainder ? static_cast<int16_t*>(t.master) : nullptr,
                                         static_cast<moment_t*>(t.exp_avg),
                                         static_cast<moment_t*>(t.exp_avg_sq)}
      .at(at);
}

// Elements [begin, end) of one tensor. 8-bit moments go block by block through float
// buffers (a chunk starts on a block boundary: kChunk is a multiple of kQuantBlock).
template <WeightKind kWeights, bool kAdamW, bool kUnscale, typename param_t>
void compact_chunk(const CompactTensor& t, MomentKind moments, const CompactMaps& maps, int64_t begin, int64_t end,
                   const AdamCoeffs<float>& c, const GradReader<float>& grads) {
  if (moments == MomentKind::kFloat) {
    compact_range<kWeights, kAdamW, kUnscale>(lanes_of<param_t, float>(t, kWeights, begin), end - begin, c, grads);
    return;
  }
  if (moments == MomentKind::kBFloat16) {
    compact_range<kWeights, kAdamW, kUnscale>(lanes_of<param_t, BFloat16>(t, kWeights, begin), end - begin, c, grads);
    return;
  }
  alignas(64) Buffer m, v;
  for (int64_t at = begin; at < end; at += kQuantBlock) {
    const int64_t n = std::min<int64_t>(kQuantBlock, end - at), block = at / kQuantBlock;
    const auto* m_codes = static_cast<uint8_t*>(t.exp_avg) + at;
    const auto* v_codes = static_cast<uint8_t*>(t.exp_avg_sq) + at;
    dequantize_block(*maps.exp_avg, m_codes, t.exp_avg_absmax[block], n, m.data());
    dequantize_block(*maps.exp_avg_sq, v_codes, t.exp_avg_sq_absmax[block], n, v.data());
    auto lanes = lanes_of<param_t, float>(t, kWeights, at);
    lanes.exp_avg = m.data();
    lanes.exp_avg_sq = v.data();
    float maxima[2];
    compact_range<kWeights, kAdamW, kUnscale, true>(lanes, n, c, grads, maxima);
    t.exp_avg_absmax[block] =
        quantize_block(*maps.exp_avg, m.data(), n, static_cast<uint8_t*>(t.exp_avg) + at, &maxima[0]);
    t.exp_avg_sq_absmax[block] =
        quantize_block(*maps.exp_avg_sq, v.data(), n, static_cast<uint8_t*>(t.exp_avg_sq) + at, &maxima[1]);
  }
}

// compact_chunk for the weights kind, among those the params' type can have: float
// params have no masters, remainders are for bfloat16 params only.
template <bool kAdamW, bool kUnscale, typename param_t>
void compact_chunk_of(WeightKind weights, const CompactTensor& t, MomentKind moments, const CompactMaps& maps,
                      int64_t begin, int64_t end, const AdamCoeffs<float>& c, const GradReader<float>& grads) {
  if constexpr (!std::is_same_v<param_t, float>) {
    if (weights == WeightKind::kMaster) {
      return compact_chunk<WeightKind::kMaster, kAdamW, kUnscale, param_t>(t, moments, maps, begin, end, c, grads);
    }
  }
  if constexpr (std::is_same_v<param_t, BFloat16>) {
    if (weights == WeightKind::kRemainder) {
      return compact_chunk<WeightKind::kRemainder, kAdamW, kUnscale, param_t>(t, moments, maps, begin, end, c, grads);
    }
  }
  CORE_OPS_ASSERT(weights == WeightKind::kParam, "weights kind not valid for these params");
  compact_chunk<WeightKind::kParam, kAdamW, kUnscale, param_t>(t, moments, maps, begin, end, c, grads);
}

void adam_compact_step(const AdamCompactArgs& a) {
  if (flag_is_set(a.found_inf)) return;  // a skipped step changes nothing, steps included
  const bool quantized = a.layout.quantized();
  const WeightKind weights = a.layout.weights;
  const CpuStep st(a.params, a.grads, a.steps, a.lr, a.lr_tensor, a.grad_scale, a.maximize);
  const CompactMaps maps{quantized ? &quantizer_for(*a.exp_avg_map) : nullptr,
                         quantized ? &quantizer_for(*a.exp_avg_sq_map) : nullptr};

  std::vector<CompactTensor> tensors(a.params.size());
  std::vector<AdamCoeffs<float>> coeffs(a.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    tensors[i] = {a.params[i].data_ptr(), st.grads[i].data_ptr(), a.exp_avgs[i].data_ptr(),
                  a.exp_avg_sqs[i].data_ptr(), quantized ? data<float>(a.exp_avg_absmaxes[i]) : nullptr,
                  quantized ? data<float>(a.exp_avg_sq_absmaxes[i]) : nullptr,
                  weights == WeightKind::kParam ? nullptr : a.master_params[i].data_ptr()};
    coeffs[i] = adam_coeffs<float>(st.lr, a.beta1, a.beta2, a.eps, a.weight_decay, st.step[i], a.bias_correction);
  }
  const auto chunks = make_chunks(a.params);
  const GradReader<float> grads(st.unscale);
  bool_switch(a.adam_w_mode, [&](auto adamw) {
    bool_switch(st.unscale.div() != 1.0, [&](auto divide) {
      CORE_OPS_DISPATCH_FLOAT_HALF_BF16(dtype_of(a.params[0]), "params", param_t,
        parallel_chunks(chunks, [&](const Chunk& ch) {
          compact_chunk_of<decltype(adamw)::value, decltype(divide)::value, param_t>(
              weights, tensors[ch.tensor], a.layout.moments, maps, ch.begin, ch.end, coeffs[ch.tensor], grads);
        }));
    });
  });
  st.finish(a.grads);
}

}  // namespace
CORE_OPS_CPU_END

CORE_OPS_CPU_OPTIMIZER(fused_adam_compact_, adam_compact_step)
