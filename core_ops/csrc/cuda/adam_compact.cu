// CUDA kernel of fused_adam_compact_: the checks and the per-element pieces of
// csrc/cpu/adam_compact.cpp (core_ops/compact_state_args.h, core_ops/compact_state.h),
// Adam's math of core_ops/adam_math.h, and found_inf, lr, grad_scale and the step
// counts kept on the device as in csrc/cuda/adam.cu.
//
// One multi_tensor_apply pass. Each thread moves kILP consecutive elements, so the
// kQuantBlock / kILP = 64 threads of two warps hold one block of 8-bit moments: they
// decode with the block's old maximum, update, take the new maximum (a warp shuffle,
// then the pair of warps through shared memory) and code with it. Codes are found by
// a binary search over the map's midpoints in shared memory: the same count of
// midpoints below the value as the CPU's table and the reference's searchsorted.
// The block maxima are not param-shaped, so they travel as per-tensor scalars: each
// tensor's slot holds the address of its first maximum.
#include <type_traits>
#include <vector>

#include <torch/csrc/stable/library.h>

#include <core_ops/adam_math.h>
#include <core_ops/compact_state_args.h>
#include <core_ops/dispatch.h>
#include <core_ops/optimizer_ops.h>
#include <core_ops/tensor.h>

#include "optimizer_launch.cuh"

namespace core_ops::cuda {
namespace {

static_assert(kQuantBlock % (kILP * 32) == 0 && kChunkSize % kQuantBlock == 0 &&
                  (kBlockSize * kILP) % kQuantBlock == 0,
              "a block of 8-bit moments is whole warps of one chunk");
constexpr int kWarpsPerQuantBlock = kQuantBlock / kILP / 32;

struct CompactScalars {
  double lr, beta1, beta2, eps, weight_decay;
  StepScalars step;
  const float* maps[2];  // exp_avg's and exp_avg_sq's maps (8-bit moments)
  WeightKind weights;
  bool bias_correction;
};

template <MomentKind kKind>
using moment_t = std::conditional_t<kKind == MomentKind::kFloat, float,
                                    std::conditional_t<kKind == MomentKind::kBFloat16, BFloat16, uint8_t>>;

// max that keeps a NaN, as the reference's amax.
__device__ __forceinline__ float max_keep_nan(float a, float b) { return (a != a || a > b) ? a : b; }

// The number of midpoints below x (mid: 256 sorted values, the last +inf); the last
// code for a NaN.
__device__ __forceinline__ uint8_t code_of(float x, const float* mid) {
  if (x != x) return kMapSize - 1;
  int pos = 0;
#pragma unroll
  for (int step = kMapSize / 2; step > 0; step >>= 1) {
    if (mid[pos + step - 1] < x) pos += step;
  }
  return static_cast<uint8_t>(pos);
}

// Lists: params, grads, exp_avgs, exp_avg_sqs, then the masters (fp32 or int16
// remainders) when kMaster; scalars: the step count, then (8-bit moments) the
// addresses of the two lists of block maxima.
template <typename param_t, MomentKind kMoments, bool kAdamW, bool kMaster_>
struct CompactAdamOp {
  static constexpr bool kCodes = kMoments == MomentKind::kCodes, kGrads = true, kMaster = kMaster_;
  static constexpr int kDepth = 4 + int(kMaster), kScalars = kCodes ? 3 : 1;
  using Meta = TensorListMeta<kDepth, kScalars>;
  using state_t = moment_t<kMoments>;

  CompactScalars s;

  __device__ void operator()(const Meta& meta, int t, int64_t begin, int len, int64_t) const {
    __shared__ float map[2][kMapSize], mid[2][kMapSize];
    __shared__ float tops[2][kBlockSize / 32];
    if (flag_is_set(s.step.found_inf)) return;
    const TensorScalars<Meta> scalars{meta, kDepth, t};
    const auto c = adam_coeffs<float>(s.step.lr.get(s.lr), s.beta1, s.beta2, s.eps, s.weight_decay,
                                      next_step(scalars), s.bias_correction);
    if constexpr (kCodes) {
      for (int j = threadIdx.x; j < kMapSize; j += blockDim.x) {
#pragma unroll
        for (int which = 0; which < 2; ++which) {
          map[which][j] = s.maps[which][j];
          mid[which][j] = map_midpoint(s.maps[which], j);
        }
      }
      __syncthreads();
    }
    param_t* p = static_cast<param_t*>(meta.addresses[0][t]) + begin;
    param_t* g = static_cast<param_t*>(meta.addresses[1][t]) + begin;
    state_t* ms = static_cast<state_t*>(meta.addresses[2][t]) + begin;
    state_t* vs = static_cast<state_t*>(meta.addresses[3][t]) + begin;
    float* master = kMaster ? static_cast<float*>(meta.addresses[4][t]) + begin : nullptr;
    int16_t* remainder = kMaster ? static_cast<int16_t*>(meta.addresses[4][t]) + begin : nullptr;
    float* absmax[2] = {nullptr, nullptr};
    if constexpr (kCodes) {
      absmax[0] = static_cast<float*>(meta.addresses[kDepth + 1][t]) + begin / kQuantBlock;
      absmax[1] = static_cast<float*>(meta.addresses[kDepth + 2][t]) + begin / kQuantBlock;
    }
    const auto grads = GradReader<float>(s.step.grad_scale, s.step.maximize);
    const bool vec = pack_aligned(p) && pack_aligned(g) && pack_aligned(ms) && pack_aligned(vs) &&
                     (!kMaster || (s.weights == WeightKind::kMaster ? pack_aligned(master) : pack_aligned(remainder)));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    // Every thread runs every round (the shuffles and barriers need all of them).
    for (int round = 0; round < len; round += blockDim.x * kILP) {
      const int i = round + threadIdx.x * kILP;
      const int n = i < len ? (len - i < kILP ? len - i : kILP) : 0;
      const int block = i / kQuantBlock;  // this chunk's block of 8-bit moments
      float x[kILP], gr[kILP] = {}, m[kILP], v[kILP];
      if (n > 0) {
        if (s.weights == WeightKind::kMaster) {
          load_pack(x, master + i, n, vec);
        } else {
          load_pack(x, p + i, n, vec);
        }
        if constexpr (std::is_same_v<param_t, BFloat16>) {
          if (s.weights == WeightKind::kRemainder) {
            int16_t r[kILP];
            load_pack(r, remainder + i, n, vec);
#pragma unroll
            for (int k = 0; k < kILP; ++k) x[k] = k < n ? join_master(p[i + k].x, r[k]) : 0.f;
          }
        }
        grads.load(gr, g + i, n, vec);
        if constexpr (kCodes) {
          int mc[kILP], vc[kILP];
          load_pack(mc, ms + i, n, vec);
          load_pack(vc, vs + i, n, vec);
          const float m_scale = absmax[0][block], v_scale = absmax[1][block];
#pragma unroll
          for (int k = 0; k < kILP; ++k) {
            m[k] = map[0][mc[k]] * m_scale;
            v[k] = map[1][vc[k]] * v_scale;
          }
        } else {
          load_pack(m, ms + i, n, vec);
          load_pack(v, vs + i, n, vec);
        }
#pragma unroll
        for (int k = 0; k < kILP; ++k) {
          float unused = 0.f;
          adam_math<kAdamW, false>(x[k], gr[k], m[k], v[k], unused, c);
        }
        store_pack(p + i, x, n, vec);
        if (s.weights == WeightKind::kMaster) store_pack(master + i, x, n, vec);
        if constexpr (std::is_same_v<param_t, BFloat16>) {
          if (s.weights == WeightKind::kRemainder) {
            int16_t r[kILP];
#pragma unroll
            for (int k = 0; k < kILP; ++k) r[k] = remainder_of(x[k], static_cast<BFloat16>(x[k]).x);
            store_pack(remainder + i, r, n, vec);
          }
        }
        if constexpr (!kCodes) {
          store_pack(ms + i, m, n, vec);
          store_pack(vs + i, v, n, vec);
        }
      }
      if constexpr (kCodes) {
        // The block's new maxima: this thread's, its warp's, then the two warps'.
        float top[2] = {0.f, 0.f};
#pragma unroll
        for (int k = 0; k < kILP; ++k) {
          if (k < n) {
            top[0] = max_keep_nan(fabsf(m[k]), top[0]);
            top[1] = max_keep_nan(fabsf(v[k]), top[1]);
          }
        }
#pragma unroll
        for (int which = 0; which < 2; ++which) {
#pragma unroll
          for (int off = 16; off > 0; off >>= 1) {
            top[which] = max_keep_nan(__shfl_xor_sync(0xffffffffu, top[which], off), top[which]);
          }
          if (lane == 0) tops[which][warp] = top[which];
        }
        __syncthreads();
        const int first = warp - warp % kWarpsPerQuantBlock;
#pragma unroll
        for (int which = 0; which < 2; ++which) {
          top[which] = tops[which][first];
#pragma unroll
          for (int w = 1; w < kWarpsPerQuantBlock; ++w) top[which] = max_keep_nan(tops[which][first + w], top[which]);
        }
        if (n > 0) {
          const float m_inv = inverse_absmax(top[0]), v_inv = inverse_absmax(top[1]);
          int mc[kILP], vc[kILP];
#pragma unroll
          for (int k = 0; k < kILP; ++k) {
            mc[k] = code_of(m[k] * m_inv, mid[0]);
            vc[k] = code_of(v[k] * v_inv, mid[1]);
          }
          store_pack(ms + i, mc, n, vec);
          store_pack(vs + i, vc, n, vec);
          if (i % kQuantBlock == 0) {  // the block's first thread
            absmax[0][block] = top[0];
            absmax[1][block] = top[1];
          }
        }
        __syncthreads();  // tops is rewritten next round
      }
    }
  }
};

void adam_compact_step(const AdamCompactArgs& a) {
  const bool quantized = a.layout.quantized();
  OptimizerLaunch launch(a.params, a.grads, a.lr_tensor, a.grad_scale, a.found_inf, a.maximize);
  const CompactScalars s{a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, launch.step(),
                         {quantized ? data<const float>(*a.exp_avg_map) : nullptr,
                          quantized ? data<const float>(*a.exp_avg_sq_map) : nullptr},
                         a.layout.weights, a.bias_correction};
  // Per-tensor scalars: the step count, then (8-bit moments) one-element views of each
  // tensor's first block maxima.
  std::vector<Tensor> first_maxima[2];
  std::vector<TensorList> scalars{a.steps};
  if (quantized) {
    for (int which = 0; which < 2; ++which) {
      const TensorList maxima = which == 0 ? a.exp_avg_absmaxes : a.exp_avg_sq_absmaxes;
      for (size_t i = 0; i < maxima.size(); ++i) {
        // An empty tensor has no maxima and no chunk that would read them.
        Tensor maximum = maxima[i];
        first_maxima[which].push_back(maxima[i].numel() > 0 ? torch::stable::narrow(maximum, 0, 0, 1) : a.steps[i]);
      }
      scalars.push_back(first_maxima[which]);
    }
  }
  const bool master = a.layout.weights != WeightKind::kParam;

  bool_switch(a.adam_w_mode, [&](auto adamw) {
    bool_switch(master, [&](auto has_master) {
      CORE_OPS_DISPATCH_FLOAT_HALF_BF16(dtype_of(a.params[0]), "params", param_t, ([&] {
        constexpr bool kW = decltype(adamw)::value, kM = decltype(has_master)::value;
        const auto run = [&](const auto& op) {
          launch.run(op, {a.exp_avgs, a.exp_avg_sqs}, a.master_params, scalars);
        };
        switch (a.layout.moments) {
          case MomentKind::kFloat: run(CompactAdamOp<param_t, MomentKind::kFloat, kW, kM>{s}); break;
          case MomentKind::kBFloat16: run(CompactAdamOp<param_t, MomentKind::kBFloat16, kW, kM>{s}); break;
          case MomentKind::kCodes: run(CompactAdamOp<param_t, MomentKind::kCodes, kW, kM>{s}); break;
        }
      }()));
    });
  });
  launch.finish(a.steps);
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(core_ops, CUDA, m) {
  m.impl("fused_adam_compact_", TORCH_BOX(&fused_adam_compact_<adam_compact_step>));
}

}  // namespace core_ops::cuda
