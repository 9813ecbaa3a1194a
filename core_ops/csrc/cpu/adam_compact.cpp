// CPU kernel of fused_adam_compact_: Adam's math (core_ops/adam_math.h) on compact state
// (core_ops/compact_state.h). Each block of kQuantBlock elements is widened into float
// buffers, updated with fused_adam_'s vector and tail loops (so a step on remainders
// computes exactly what a step on fp32 masters does), and narrowed back; 8-bit moments
// take their block's new maximum on the way out.
#include <array>
#include <cmath>
#include <memory>
#include <mutex>

#include <torch/library.h>
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif

#include <core_ops/adam_math.h>
#include <core_ops/compact_state_args.h>

#include "optimizer_step.h"

namespace core_ops::cpu {
namespace {

// A map with its midpoints and, for every bfloat16 bit pattern h (the top half of a
// float), the codes of the floats with that top half, in one int32 so that a vector
// lane reads it with one gather: bits 0-7 hold the number of midpoints below the
// pattern's smallest float; bits 8-23 a key K such that a float x of the pattern lies
// above the next midpoint iff key(x) > K, key(x) being x's low 16 bits, flipped for a
// negative x (there a larger magnitude is a smaller value). K is 0xFFFF (never
// exceeded) when no midpoint falls inside the pattern. That needs at most one midpoint
// per pattern: true of the dynamic maps, checked here; another map takes code_from.
struct Quantizer {
  std::array<float, kMapSize> map, mid;
  std::array<int32_t, 65536> entry;
  bool one_step = true;

  explicit Quantizer(const float* values) {
    std::copy(values, values + kMapSize, map.begin());
    for (int j = 0; j < kMapSize; ++j) mid[j] = map_midpoint(values, j);
    for (uint32_t h = 0; h < 65536; ++h) {
      const bool negative = h & 0x8000;
      const float lo = bits_float(negative ? (h << 16) | 0xFFFF : h << 16);  // the pattern's smallest float
      const float hi = bits_float(negative ? h << 16 : (h << 16) | 0xFFFF);  // and largest
      if (std::isnan(lo)) {
        entry[h] = (kMapSize - 1) | (0xFFFF << 8);
        continue;
      }
      const int32_t start = static_cast<int32_t>(std::lower_bound(mid.begin(), mid.end() - 1, lo) - mid.begin());
      const auto last = std::upper_bound(mid.begin(), mid.end() - 1, hi) - mid.begin();  // codes start..last
      one_step = one_step && last - start <= 1;
      uint32_t key = 0xFFFF;
      if (last > start) {
        const uint32_t low = float_bits(mid[start]) & 0xFFFF;
        key = negative ? 0xFFFF - low : low;
      }
      entry[h] = start | static_cast<int32_t>(key << 8);
    }
  }

  uint8_t code(float normalized) const {
    return code_from(normalized, mid.data(), entry[float_bits(normalized) >> 16] & 0xFF);
  }
};

using iVec = at::vec::Vectorized<int32_t>;
constexpr int64_t kLanes = fVec::size();

// Lane-wise table reads. at::vec::gather reads int32 lanes one by one; the
// instructions read the whole vector.
inline fVec gather_floats(const float* table, const iVec& index) {
#if defined(CPU_CAPABILITY_AVX512)
  return _mm512_i32gather_ps(index, table, sizeof(float));
#elif defined(CPU_CAPABILITY_AVX2)
  return _mm256_i32gather_ps(table, index, sizeof(float));
#else
  return at::vec::gather<sizeof(float)>(table, index);
#endif
}

inline iVec gather_ints(const int32_t* table, const iVec& index) {
#if defined(CPU_CAPABILITY_AVX512)
  return _mm512_i32gather_epi32(index, table, sizeof(int32_t));
#elif defined(CPU_CAPABILITY_AVX2)
  return _mm256_i32gather_epi32(table, index, sizeof(int32_t));
#else
  return at::vec::gather<sizeof(int32_t)>(table, index);
#endif
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
// amax), then each element's code.
float quantize_block(const Quantizer& q, const float* in, int64_t n, uint8_t* codes) {
  fVec vtop(0.f);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) vtop = at::vec::maximum(vtop, fVec::loadu(in + i).abs());
  float top = at::vec::vec_reduce_all<float>([](fVec& a, fVec& b) { return at::vec::maximum(a, b); }, vtop);
  for (; i < n; ++i) {
    const float a = std::fabs(in[i]);
    if (a > top || std::isnan(a)) top = a;
  }
  const float inv = inverse_absmax(top);
  i = 0;
  if (q.one_step) {
    alignas(64) int32_t out[kQuantBlock];
    const fVec vinv(inv);
    const iVec low8(0xFF), low16(0xFFFF), one(1), by8(8), by16(16), by31(31);
    for (; i + kLanes <= n; i += kLanes) {
      const iVec bits = at::vec::cast<int32_t>(fVec::loadu(in + i) * vinv);
      const iVec e = gather_ints(q.entry.data(), (bits >> by16) & low16);
      const iVec key = (bits & low16) ^ ((bits >> by31) & low16);  // flipped for negatives
      const iVec above = at::vec::cast<int32_t>(key > ((e >> by8) & low16)) & one;
      ((e & low8) + above).store(out + i);
    }
    for (int64_t j = 0; j < i; ++j) codes[j] = static_cast<uint8_t>(out[j]);
  }
  for (; i < n; ++i) codes[i] = q.code(in[i] * inv);
  return top;
}

// Built once per distinct map (the optimizers use two) and kept: 66 KB each.
const Quantizer& quantizer_for(const at::Tensor& map) {
  static std::mutex lock;
  static std::vector<std::unique_ptr<Quantizer>> built;
  const float* values = map.const_data_ptr<float>();
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
    case MomentKind::kBFloat16: widen(static_cast<c10::BFloat16*>(state) + at, out, n); break;
    case MomentKind::kCodes:
      dequantize_block(*q, static_cast<uint8_t*>(state) + at, absmax[at / kQuantBlock], n, out);
  }
}

void store_moment(MomentKind kind, void* state, float* absmax, const Quantizer* q, int64_t at, int64_t n,
                  const float* in) {
  switch (kind) {
    case MomentKind::kFloat: std::copy_n(in, n, static_cast<float*>(state) + at); break;
    case MomentKind::kBFloat16: narrow(in, static_cast<c10::BFloat16*>(state) + at, n); break;
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

template <typename param_t>
void store_weights(WeightKind kind, const CompactPtrs& t, int64_t at, int64_t n, const float* in) {
  auto* p = static_cast<param_t*>(t.param) + at;
  narrow(in, p, n);
  if (kind == WeightKind::kMaster) std::copy_n(in, n, static_cast<float*>(t.master) + at);
  if (kind == WeightKind::kRemainder) {
    // remainder_of in integer lanes the compiler vectorizes.
    const auto* bits = reinterpret_cast<const uint16_t*>(p);
    auto* r = static_cast<int16_t*>(t.master) + at;
    alignas(64) uint32_t master[kQuantBlock];
    std::memcpy(master, in, n * sizeof(float));
    for (int64_t i = 0; i < n; ++i) {
      int32_t d = int32_t(master[i] - (uint32_t(bits[i]) << 16));
      d = d > 0x7FFF ? 0x7FFF : (d < -0x7FFF ? -0x7FFF : d);
      r[i] = (master[i] & 0x7FFFFFFFu) > 0x7F800000u ? int16_t(0) : int16_t(d);  // 0 for a NaN
    }
  }
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

template <bool kAdamW, bool kUnscale, typename param_t>
void compact_chunk(const CompactPtrs& t, const CompactKinds& k, int64_t begin, int64_t end,
                   const AdamCoeffs<float>& c, const GradUnscale& unscale) {
  const GradReader<float> grads(unscale);
  Buffer w, g, m, v;
  for (int64_t at = begin; at < end; at += kQuantBlock) {
    const int64_t n = std::min<int64_t>(kQuantBlock, end - at);
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

void fused_adam_compact_(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                         at::TensorList exp_avg_sqs, at::TensorList exp_avg_absmaxes,
                         at::TensorList exp_avg_sq_absmaxes, at::TensorList master_params,
                         at::TensorList steps, const std::optional<at::Tensor>& exp_avg_map,
                         const std::optional<at::Tensor>& exp_avg_sq_map, double lr, double beta1,
                         double beta2, double eps, double weight_decay, bool adam_w_mode,
                         bool bias_correction, bool maximize, const std::optional<at::Tensor>& lr_tensor,
                         const std::optional<at::Tensor>& grad_scale, const std::optional<at::Tensor>& found_inf) {
  if (!check_optimizer_group(params, grads, steps, lr_tensor, grad_scale, found_inf)) return;
  check_compact_params(params);
  const MomentKind moments = check_compact_moments(params, exp_avgs, exp_avg_sqs);
  const bool quantized = moments == MomentKind::kCodes;
  check_absmaxes(params, exp_avg_absmaxes, "exp_avg_absmaxes", exp_avg_map, "exp_avg_map", quantized);
  check_absmaxes(params, exp_avg_sq_absmaxes, "exp_avg_sq_absmaxes", exp_avg_sq_map, "exp_avg_sq_map", quantized);
  const WeightKind weights = check_compact_masters(params, master_params);
  if (flag_is_set(found_inf)) return;  // a skipped step changes nothing, steps included

  lr = value_or(lr_tensor, lr);
  const GradUnscale unscale(grad_scale, maximize);
  const std::vector<double> step = advance_steps(steps);
  const CompactKinds kinds{moments, weights, quantized ? &quantizer_for(*exp_avg_map) : nullptr,
                           quantized ? &quantizer_for(*exp_avg_sq_map) : nullptr};

  const std::vector<at::Tensor> gs = grads_like_params(params, grads);
  std::vector<CompactPtrs> ptrs(params.size());
  std::vector<AdamCoeffs<float>> coeffs(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    ptrs[i] = {params[i].data_ptr(), gs[i].data_ptr(), exp_avgs[i].data_ptr(), exp_avg_sqs[i].data_ptr(),
               quantized ? exp_avg_absmaxes[i].data_ptr<float>() : nullptr,
               quantized ? exp_avg_sq_absmaxes[i].data_ptr<float>() : nullptr,
               weights == WeightKind::kParam ? nullptr : master_params[i].data_ptr()};
    coeffs[i] = adam_coeffs<float>(lr, beta1, beta2, eps, weight_decay, step[i], bias_correction);
  }
  const auto chunks = make_chunks(params);
  bool_switch(adam_w_mode, [&](auto adamw) {
    bool_switch(unscale.div() != 1.0, [&](auto divide) {
      CORE_OPS_DISPATCH_FLOAT_HALF_BF16(params[0].scalar_type(), "params", param_t,
        parallel_chunks(chunks, [&](const Chunk& ch) {
          compact_chunk<decltype(adamw)::value, decltype(divide)::value, param_t>(
              ptrs[ch.tensor], kinds, ch.begin, ch.end, coeffs[ch.tensor], unscale);
        }));
    });
  });
  if (unscale.write) copy_back_grads(grads, gs);
}

}  // namespace

TORCH_LIBRARY_IMPL(core_ops, CPU, m) {
  m.impl("fused_adam_compact_", &fused_adam_compact_);
}

}  // namespace core_ops::cpu
