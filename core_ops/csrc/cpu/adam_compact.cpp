// CPU kernel of fused_adam_compact_: Adam's math (core_ops/adam_math.h) on compact state
// (core_ops/compact_state.h). Each block of kQuantBlock elements is widened into float
// buffers, updated with fused_adam_'s vector and tail loops (so a step on remainders
// computes exactly what a step on fp32 masters does), and narrowed back; 8-bit moments
// take their block's new maximum on the way out.
#include <array>
#include <cmath>
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
  std::vector<int32_t> entry;  // [positive magnitudes, negative magnitudes], `range` each
  int32_t base = 0, range = 0;  // magnitude pattern of entry 0, entries per sign
  bool one_step = true;

  explicit Quantizer(const float* values) {
    std::copy(values, values + kMapSize, map.begin());
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

// Two vectors of moments decoded from their codes and their block's maximum.
inline void decode2(const Quantizer& q, const uint8_t* codes, const fVec& scale, fVec& a, fVec& b) {
  a = gather_floats(q.map.data(), load_codes(codes)) * scale;
  b = gather_floats(q.map.data(), load_codes(codes + kLanes)) * scale;
}

inline float max_abs(const fVec& top) {
  return vec::vec_reduce_all<float>([](fVec& a, fVec& b) { return vec::maximum(a, b); }, top);
}

// out[i] = map[codes[i]] * scale for a block.
void dequantize_block(const Quantizer& q, const uint8_t* codes, float scale, int64_t n, float* out) {
  alignas(64) int32_t index[kQuantBlock];
  for (int64_t i = 0; i < n; ++i) index[i] = codes[i];
  const fVec vscale(scale);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    (gather_floats(q.map.data(), iVec::loadu(index + i)) * vscale).store(out + i);
  }
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

struct CompactPtrs {
  void* param;
  void* grad;
  void* exp_avg;
  void* exp_avg_sq;
  float* exp_avg_absmax;     // 8-bit moments only
  float* exp_avg_sq_absmax;
  void* master;              // fp32 master or int16 remainder
};

struct CompactKinds {
  MomentKind moments;
  WeightKind weights;
  const Quantizer* m_map;
  const Quantizer* v_map;
};

using Buffer = std::array<float, kQuantBlock>;

template <typename T>
void widen(const T* src, float* dst, int64_t n) {
  int64_t i = 0;
  if constexpr (!std::is_same_v<T, float>) {
    for (; i + kWidth <= n; i += kWidth) {
      fVec a, b;
      load2(src + i, a, b);
      store2(dst + i, a, b);
    }
  }
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

template <typename T>
void narrow(const float* src, T* dst, int64_t n) {
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) {
    fVec a, b;
    load2(src + i, a, b);
    store2(dst + i, a, b);
  }
  for (; i < n; ++i) dst[i] = static_cast<T>(src[i]);
}

void load_moment(MomentKind kind, void* state, const float* absmax, const Quantizer* q, int64_t at,
                 int64_t n, float* out) {
  switch (kind) {
    case MomentKind::kFloat: std::copy_n(static_cast<float*>(state) + at, n, out); break;
    case MomentKind::kBFloat16: widen(static_cast<BFloat16*>(state) + at, out, n); break;
    case MomentKind::kCodes:
      dequantize_block(*q, static_cast<uint8_t*>(state) + at, absmax[at / kQuantBlock], n, out);
  }
}

void store_moment(MomentKind kind, void* state, float* absmax, const Quantizer* q, int64_t at, int64_t n,
                  const float* in) {
  switch (kind) {
    case MomentKind::kFloat: std::copy_n(in, n, static_cast<float*>(state) + at); break;
    case MomentKind::kBFloat16: narrow(in, static_cast<BFloat16*>(state) + at, n); break;
    case MomentKind::kCodes:
      absmax[at / kQuantBlock] = quantize_block(*q, in, n, static_cast<uint8_t*>(state) + at);
  }
}

template <typename param_t>
void load_weights(WeightKind kind, const CompactPtrs& t, int64_t at, int64_t n, float* out) {
  const auto* p = static_cast<const param_t*>(t.param) + at;
  switch (kind) {
    case WeightKind::kParam: widen(p, out, n); break;
    case WeightKind::kMaster: std::copy_n(static_cast<float*>(t.master) + at, n, out); break;
    case WeightKind::kRemainder: {
      // join_master in integer lanes the compiler vectorizes, then the bits as floats.
      const auto* bits = reinterpret_cast<const uint16_t*>(p);
      const auto* r = static_cast<const int16_t*>(t.master) + at;
      alignas(64) uint32_t joined[kQuantBlock];
      for (int64_t i = 0; i < n; ++i) joined[i] = (uint32_t(bits[i]) << 16) + uint32_t(int32_t(r[i]));
      std::memcpy(out, joined, n * sizeof(float));
    }
  }
}

// The remainders of masters `in` beside their params, already written.
template <typename param_t>
void store_remainders_of(const CompactPtrs& t, int64_t at, int64_t n, const float* in) {
  // remainder_of in integer lanes the compiler vectorizes.
  const auto* bits = reinterpret_cast<const uint16_t*>(static_cast<const param_t*>(t.param) + at);
  auto* r = static_cast<int16_t*>(t.master) + at;
  alignas(64) uint32_t master[kQuantBlock];
  std::memcpy(master, in, n * sizeof(float));
  for (int64_t i = 0; i < n; ++i) {
    int32_t d = int32_t(master[i] - (uint32_t(bits[i]) << 16));
    d = d > 0x7FFF ? 0x7FFF : (d < -0x7FFF ? -0x7FFF : d);
    r[i] = (master[i] & 0x7FFFFFFFu) > 0x7F800000u ? int16_t(0) : int16_t(d);  // 0 for a NaN
  }
}

template <typename param_t>
void store_weights(WeightKind kind, const CompactPtrs& t, int64_t at, int64_t n, const float* in) {
  narrow(in, static_cast<param_t*>(t.param) + at, n);
  if (kind == WeightKind::kMaster) std::copy_n(in, n, static_cast<float*>(t.master) + at);
  if (kind == WeightKind::kRemainder) store_remainders_of<param_t>(t, at, n, in);
}

// Grads as fused_adam_ reads them (divided by grad_scale, written back so).
template <bool kUnscale, typename param_t>
void load_grads(const CompactPtrs& t, int64_t at, int64_t n, const GradReader<float>& grads, float* out) {
  auto* g = static_cast<param_t*>(t.grad) + at;
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) {
    fVec a, b;
    if constexpr (kUnscale) grads.load(g + i, a, b); else load2(g + i, a, b);
    store2(out + i, a, b);
  }
  for (; i < n; ++i) out[i] = kUnscale ? grads.load(g + i) : static_cast<float>(g[i]);
}

// A whole block with 8-bit moments: moments decoded inside the vector loop and their
// maxima taken there, so the block is read once and only coding takes a second pass.
// The same operations on the same values as the buffered path below.
template <bool kAdamW, bool kUnscale, typename param_t>
void codes_block(const CompactPtrs& t, const CompactKinds& k, int64_t at, const AdamCoeffs<float>& c,
                 const GradReader<float>& grads, Buffer& w, Buffer& m, Buffer& v) {
  // Remainders are joined and split in integer passes over the block, which measured
  // faster than the same in vector lanes inside the loop.
  if (k.weights == WeightKind::kRemainder) load_weights<param_t>(k.weights, t, at, kQuantBlock, w.data());
  auto* p = static_cast<param_t*>(t.param) + at;
  auto* master = static_cast<float*>(t.master) + at;  // kMaster only
  auto* g = static_cast<param_t*>(t.grad) + at;
  const auto* m_codes = static_cast<const uint8_t*>(t.exp_avg) + at;
  const auto* v_codes = static_cast<const uint8_t*>(t.exp_avg_sq) + at;
  const fVec m_scale(t.exp_avg_absmax[at / kQuantBlock]), v_scale(t.exp_avg_sq_absmax[at / kQuantBlock]);
  fVec m_top(0.f), v_top(0.f);
  for (int64_t i = 0; i < kQuantBlock; i += kWidth) {
    fVec p0, p1, g0, g1, m0, m1, v0, v1, x0, x1;
    switch (k.weights) {
      case WeightKind::kParam: load2(p + i, p0, p1); break;
      case WeightKind::kMaster: load2(master + i, p0, p1); break;
      case WeightKind::kRemainder: load2(w.data() + i, p0, p1); break;
    }
    if constexpr (kUnscale) grads.load(g + i, g0, g1); else load2(g + i, g0, g1);
    decode2(*k.m_map, m_codes + i, m_scale, m0, m1);
    decode2(*k.v_map, v_codes + i, v_scale, v0, v1);
    adam_math<kAdamW, false>(p0, g0, m0, v0, x0, c);
    adam_math<kAdamW, false>(p1, g1, m1, v1, x1, c);
    store2(p + i, p0, p1);
    if (k.weights == WeightKind::kMaster) store2(master + i, p0, p1);
    if (k.weights == WeightKind::kRemainder) store2(w.data() + i, p0, p1);
    store2(m.data() + i, m0, m1);
    store2(v.data() + i, v0, v1);
    m_top = vec::maximum(m_top, vec::maximum(m0.abs(), m1.abs()));
    v_top = vec::maximum(v_top, vec::maximum(v0.abs(), v1.abs()));
  }
  if (k.weights == WeightKind::kRemainder) store_remainders_of<param_t>(t, at, kQuantBlock, w.data());
  const float m_max = max_abs(m_top), v_max = max_abs(v_top);
  t.exp_avg_absmax[at / kQuantBlock] =
      quantize_block(*k.m_map, m.data(), kQuantBlock, static_cast<uint8_t*>(t.exp_avg) + at, &m_max);
  t.exp_avg_sq_absmax[at / kQuantBlock] =
      quantize_block(*k.v_map, v.data(), kQuantBlock, static_cast<uint8_t*>(t.exp_avg_sq) + at, &v_max);
}

template <bool kAdamW, bool kUnscale, typename param_t>
void compact_chunk(const CompactPtrs& t, const CompactKinds& k, int64_t begin, int64_t end,
                   const AdamCoeffs<float>& c, const GradUnscale& unscale) {
  const GradReader<float> grads(unscale);
  Buffer w, g, m, v;
  for (int64_t at = begin; at < end; at += kQuantBlock) {
    const int64_t n = std::min<int64_t>(kQuantBlock, end - at);
    if (k.moments == MomentKind::kCodes && n == kQuantBlock && k.m_map->one_step && k.v_map->one_step) {
      codes_block<kAdamW, kUnscale, param_t>(t, k, at, c, grads, w, m, v);
      continue;
    }
    load_weights<param_t>(k.weights, t, at, n, w.data());
    load_grads<kUnscale, param_t>(t, at, n, grads, g.data());
    load_moment(k.moments, t.exp_avg, t.exp_avg_absmax, k.m_map, at, n, m.data());
    load_moment(k.moments, t.exp_avg_sq, t.exp_avg_sq_absmax, k.v_map, at, n, v.data());
    int64_t i = 0;
    for (; i + kWidth <= n; i += kWidth) {
      fVec p0, p1, g0, g1, m0, m1, v0, v1, x0, x1;
      load2(w.data() + i, p0, p1);
      load2(g.data() + i, g0, g1);
      load2(m.data() + i, m0, m1);
      load2(v.data() + i, v0, v1);
      adam_math<kAdamW, false>(p0, g0, m0, v0, x0, c);
      adam_math<kAdamW, false>(p1, g1, m1, v1, x1, c);
      store2(w.data() + i, p0, p1);
      store2(m.data() + i, m0, m1);
      store2(v.data() + i, v0, v1);
    }
    for (; i < n; ++i) {
      float unused = 0.f;
      adam_math<kAdamW, false>(w[i], g[i], m[i], v[i], unused, c);
    }
    store_weights<param_t>(k.weights, t, at, n, w.data());
    store_moment(k.moments, t.exp_avg, t.exp_avg_absmax, k.m_map, at, n, m.data());
    store_moment(k.moments, t.exp_avg_sq, t.exp_avg_sq_absmax, k.v_map, at, n, v.data());
  }
}

void adam_compact_step(const AdamCompactArgs& a) {
  if (flag_is_set(a.found_inf)) return;  // a skipped step changes nothing, steps included
  const bool quantized = a.layout.quantized();
  const WeightKind weights = a.layout.weights;
  const CpuStep st(a.params, a.grads, a.steps, a.lr, a.lr_tensor, a.grad_scale, a.maximize);
  const CompactKinds kinds{a.layout.moments, weights, quantized ? &quantizer_for(*a.exp_avg_map) : nullptr,
                           quantized ? &quantizer_for(*a.exp_avg_sq_map) : nullptr};

  std::vector<CompactPtrs> ptrs(a.params.size());
  std::vector<AdamCoeffs<float>> coeffs(a.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    ptrs[i] = {a.params[i].data_ptr(), st.grads[i].data_ptr(), a.exp_avgs[i].data_ptr(), a.exp_avg_sqs[i].data_ptr(),
               quantized ? data<float>(a.exp_avg_absmaxes[i]) : nullptr,
               quantized ? data<float>(a.exp_avg_sq_absmaxes[i]) : nullptr,
               weights == WeightKind::kParam ? nullptr : a.master_params[i].data_ptr()};
    coeffs[i] = adam_coeffs<float>(st.lr, a.beta1, a.beta2, a.eps, a.weight_decay, st.step[i], a.bias_correction);
  }
  const auto chunks = make_chunks(a.params);
  bool_switch(a.adam_w_mode, [&](auto adamw) {
    bool_switch(st.unscale.div() != 1.0, [&](auto divide) {
      CORE_OPS_DISPATCH_FLOAT_HALF_BF16(dtype_of(a.params[0]), "params", param_t,
        parallel_chunks(chunks, [&](const Chunk& ch) {
          compact_chunk<decltype(adamw)::value, decltype(divide)::value, param_t>(
              ptrs[ch.tensor], kinds, ch.begin, ch.end, coeffs[ch.tensor], st.unscale);
        }));
    });
  });
  st.finish(a.grads);
}

}  // namespace
CORE_OPS_CPU_END

CORE_OPS_CPU_OPTIMIZER(fused_adam_compact_, adam_compact_step)
