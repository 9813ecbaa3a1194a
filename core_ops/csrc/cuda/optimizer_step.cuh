// What every CUDA fused optimizer kernel shares, the device-side twin of
// csrc/cpu/optimizer_step.h: found_inf, lr and grad_scale are read by the kernels on
// the device and the per-tensor step counts are advanced there too, so a step never
// waits on the host (and can be captured in a CUDA graph).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include <core_ops/bool_switch.h>
#include <core_ops/tensor.h>

#include "multi_tensor_apply.cuh"

namespace core_ops::cuda {

// `> 0` as the CPU kernels and the reference: a nan flag does not count as set. An
// absent flag (nullptr) is never set.
__device__ __forceinline__ bool flag_is_set(const FoundInf& f) {
  if (f.ptr == nullptr) return false;
  return f.is_int ? *static_cast<const int32_t*>(f.ptr) > 0 : *static_cast<const float*>(f.ptr) > 0.f;
}

inline FoundInf optional_flag(const OptionalTensor& found_inf) {
  return found_inf.has_value() ? found_inf_arg(*found_inf) : FoundInf{nullptr, false};
}

// An optional one-element tensor (lr, grad_scale) the kernels read on the device, as
// a double like the CPU kernels' item<double>(). float32 and float64 tensors are read
// where they are; any other dtype is first cast to float64 on the device (`keep`
// holds the copy until the kernels are enqueued: the caching allocator orders its
// reuse after them on the stream).
struct DeviceScalar {
  const void* ptr;  // nullptr: absent, get() returns the fallback
  bool is_double;

  __device__ __forceinline__ double get(double fallback) const {
    if (ptr == nullptr) return fallback;
    return is_double ? *static_cast<const double*>(ptr)
                     : static_cast<double>(*static_cast<const float*>(ptr));
  }
};

inline DeviceScalar device_scalar_arg(const OptionalTensor& t, OptionalTensor& keep) {
  if (!t.has_value()) return {nullptr, false};
  const auto dtype = dtype_of(*t);
  keep = (dtype == ScalarType::Float || dtype == ScalarType::Double) ? *t : torch::stable::to(*t, ScalarType::Double);
  return {keep->data_ptr(), dtype_of(*keep) == ScalarType::Double};
}

// How a step reads its grads, on the device: divided by grad_scale (by -grad_scale for
// maximize, which also negates, exactly) and, when a scale other than 1 was given,
// written back unscaled (Note [Grads written back unscaled] in optimizer_args.h).
template <typename acc_t>
struct GradReader {
  acc_t div;
  bool maximize, write;

  __device__ GradReader(const DeviceScalar& grad_scale, bool maximize_) {
    const double scale = grad_scale.get(1.0);
    div = static_cast<acc_t>(maximize_ ? -scale : scale);
    maximize = maximize_;
    write = grad_scale.ptr != nullptr && scale != 1.0;
  }

  // r = g[0, n) / div; each thread writes back only the elements it read.
  template <typename T>
  __device__ __forceinline__ void load(acc_t (&r)[kILP], T* g, int n, bool vec) const {
    load_pack(r, g, n, vec);
#pragma unroll
    for (int k = 0; k < kILP; ++k) r[k] = r[k] / div;
    if (write) {
      acc_t out[kILP];
#pragma unroll
      for (int k = 0; k < kILP; ++k) out[k] = maximize ? -r[k] : r[k];
      store_pack(g, out, n, vec);
    }
  }
};

// What every optimizer step reads on the device besides its hyperparameters: lr as a
// tensor (absent: the double the schema gave), grad_scale, found_inf and maximize.
// OptimizerLaunch (optimizer_launch.cuh) fills it in.
struct StepScalars {
  DeviceScalar lr, grad_scale;
  FoundInf found_inf;
  bool maximize;
};

// Note [One functor moves an optimizer's memory]: every elementwise optimizer kernel
// reads the weights (the fp32 master when there is one, else the param), maybe the
// grads (unscaled by GradReader), its state slots, read-only inputs; runs its math per
// element; and writes back the slots, its outputs and the weights (master and param).
// ElementwiseStep does that movement once (packs of kILP, one alignment test per
// chunk, padding computed on zeros and never stored) for params of param_t, state and
// math in acc_t, with fp32 masters or not (kMaster); a Policy says what an optimizer
// has and does:
//   kGrads, kSlots, kInputs, kOutputs, kWritesWeights, kScalars
//   s.step                       its StepScalars: found_inf, when set, leaves the chunk
//                                alone (a skipped step changes nothing); the grads are
//                                read through a GradReader of grad_scale and maximize
//   coeffs(scalars)              the chunk's coefficients, from the tensor's scalars
//   math(x, g, slots, inputs, outputs, coeffs)   one element, on acc_t arrays
// Lists, in this order: params, grads (kGrads), the slots, the inputs, the outputs, the
// masters (kMaster); then the kScalars per-tensor scalars (step counts, norms).
constexpr int at_least_one(int n) { return n > 0 ? n : 1; }

// Tensor t's per-tensor scalars of a launch (after its kDepth lists).
template <typename Meta>
struct TensorScalars {
  const Meta& meta;
  int first, t;

  template <typename T>
  __device__ __forceinline__ T get(int j) const {
    return *static_cast<const T*>(meta.addresses[first + j][t]);
  }
};

// The step count (scalar j) plus one, the step this update makes, rounded in float as
// the CPU kernels' `*step += 1.f`.
template <typename Meta>
__device__ __forceinline__ double next_step(const TensorScalars<Meta>& scalars, int j = 0) {
  return static_cast<double>(scalars.template get<float>(j) + 1.f);
}

// The lists of a launch in a policy's order, as multi_tensor_apply takes them.
template <int N>
std::array<TensorList, N> to_array(const std::vector<TensorList>& lists) {
  CORE_OPS_ASSERT(lists.size() == N, "expected ", N, " lists, got ", lists.size());
  std::array<TensorList, N> out;
  std::copy(lists.begin(), lists.end(), out.begin());
  return out;
}

template <typename param_t, typename acc_t, bool kMaster_, typename Policy>
struct ElementwiseStep {
  static constexpr int kS = Policy::kSlots, kI = Policy::kInputs, kO = Policy::kOutputs;
  static constexpr bool kG = Policy::kGrads, kM = kMaster_, kW = Policy::kWritesWeights;
  static constexpr bool kGrads = kG, kMaster = kM;  // as OptimizerLaunch::run reads them
  static constexpr int kDepth = 1 + int(kG) + kS + kI + kO + int(kM), kScalars = Policy::kScalars;
  using Meta = TensorListMeta<kDepth, Policy::kScalars>;

  Policy policy;

  template <typename T>
  __device__ __forceinline__ static T* list(const Meta& meta, int l, int t, int64_t begin) {
    return static_cast<T*>(meta.addresses[l][t]) + begin;
  }

  __device__ void operator()(const Meta& meta, int t, int64_t begin, int len, int64_t) const {
    const StepScalars& step = policy.s.step;
    if (flag_is_set(step.found_inf)) return;
    const auto c = policy.coeffs(TensorScalars<Meta>{meta, kDepth, t});

    constexpr int kFirstSlot = 1 + int(kG), kFirstInput = kFirstSlot + kS, kFirstOutput = kFirstInput + kI;
    param_t* p = list<param_t>(meta, 0, t, begin);
    param_t* g = kG ? list<param_t>(meta, 1, t, begin) : nullptr;
    acc_t* w = kM ? list<acc_t>(meta, kFirstOutput + kO, t, begin) : nullptr;
    acc_t* slot[at_least_one(kS)];
    const acc_t* input[at_least_one(kI)];
    acc_t* output[at_least_one(kO)];
    bool vec = pack_aligned(p) && (!kG || pack_aligned(g)) && (!kM || pack_aligned(w));
#pragma unroll
    for (int j = 0; j < kS; ++j) {
      slot[j] = list<acc_t>(meta, kFirstSlot + j, t, begin);
      vec = vec && pack_aligned(slot[j]);
    }
#pragma unroll
    for (int j = 0; j < kI; ++j) {
      input[j] = list<const acc_t>(meta, kFirstInput + j, t, begin);
      vec = vec && pack_aligned(input[j]);
    }
#pragma unroll
    for (int j = 0; j < kO; ++j) {
      output[j] = list<acc_t>(meta, kFirstOutput + j, t, begin);
      vec = vec && pack_aligned(output[j]);
    }

    const auto reader = [&] {
      if constexpr (kG) {
        return GradReader<acc_t>(step.grad_scale, step.maximize);
      } else {
        return 0;  // no grads read
      }
    }();

    for_each_pack(len, [&](int i, int n) {
      acc_t x[kILP], gr[kILP] = {}, s[at_least_one(kS)][kILP], in[at_least_one(kI)][kILP],
          out[at_least_one(kO)][kILP];
      if constexpr (kM) {
        load_pack(x, w + i, n, vec);
      } else {
        load_pack(x, p + i, n, vec);
      }
      if constexpr (kG) reader.load(gr, g + i, n, vec);
#pragma unroll
      for (int j = 0; j < kS; ++j) load_pack(s[j], slot[j] + i, n, vec);
#pragma unroll
      for (int j = 0; j < kI; ++j) load_pack(in[j], input[j] + i, n, vec);
#pragma unroll
      for (int k = 0; k < kILP; ++k) {
        acc_t se[at_least_one(kS)], ie[at_least_one(kI)], oe[at_least_one(kO)];
#pragma unroll
        for (int j = 0; j < kS; ++j) se[j] = s[j][k];
#pragma unroll
        for (int j = 0; j < kI; ++j) ie[j] = in[j][k];
        policy.math(x[k], gr[k], se, ie, oe, c);
#pragma unroll
        for (int j = 0; j < kS; ++j) s[j][k] = se[j];
#pragma unroll
        for (int j = 0; j < kO; ++j) out[j][k] = oe[j];
      }
#pragma unroll
      for (int j = 0; j < kS; ++j) store_pack(slot[j] + i, s[j], n, vec);
#pragma unroll
      for (int j = 0; j < kO; ++j) store_pack(output[j] + i, out[j], n, vec);
      if constexpr (kW) {
        if constexpr (kM) store_pack(w + i, x, n, vec);
        store_pack(p + i, x, n, vec);
      }
    });
  }
};

// steps[i] += 1 (in float, as the CPU kernels) unless found_inf is set. Launched after
// the update kernels on the same stream, so it runs once every block that read the
// old counts has finished. The step pointers travel in the kernel argument, a batch of
// as many as the multi-tensor descriptor's budget holds per launch: no host-to-device
// copy and, for up to 2559 tensors, one launch.
constexpr int kStepBlock = 256;
constexpr int kStepsPerLaunch = static_cast<int>((kMetaBytes - sizeof(int64_t)) / sizeof(float*));

struct StepBatch {
  float* steps[kStepsPerLaunch];
  int64_t count;
};
static_assert(sizeof(StepBatch) + sizeof(FoundInf) <= kKernelArgBytes,
              "the step batch must fit the kernel-argument limit");

// A template only so that every .cu including this header may define it (a plain
// __global__ function in a header is a duplicate symbol at link time).
template <typename = void>
__global__ void __launch_bounds__(kStepBlock)
    advance_steps_kernel(const __grid_constant__ StepBatch batch, const FoundInf found_inf) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < batch.count && !flag_is_set(found_inf)) *batch.steps[i] += 1.f;
}

// steps: one-element float32 tensors on the device whose current stream is `stream`
// (check_optimizer_group).
inline void advance_steps(TensorList steps, const FoundInf& found_inf, cudaStream_t stream) {
  StepBatch batch;
  const int64_t n = static_cast<int64_t>(steps.size());
  for (int64_t first = 0; first < n; first += kStepsPerLaunch) {
    batch.count = std::min<int64_t>(kStepsPerLaunch, n - first);
    for (int64_t i = 0; i < batch.count; ++i) {
      batch.steps[i] = static_cast<float*>(steps[first + i].data_ptr());
    }
    const auto blocks = static_cast<unsigned>((batch.count + kStepBlock - 1) / kStepBlock);
    advance_steps_kernel<><<<blocks, kStepBlock, 0, stream>>>(batch, found_inf);
    check_launch("advance_steps_kernel");
  }
}

}  // namespace core_ops::cuda
