// What every CUDA fused optimizer kernel shares, the device-side twin of
// csrc/cpu/optimizer_step.h: found_inf, lr and grad_scale are read by the kernels on
// the device and the per-tensor step counts are advanced there too, so a step never
// waits on the host (and can be captured in a CUDA graph).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <core_ops/bool_switch.h>

#include "multi_tensor_apply.cuh"

namespace core_ops::cuda {

// `> 0` as the CPU kernels and the reference: a nan flag does not count as set. An
// absent flag (nullptr) is never set.
__device__ __forceinline__ bool flag_is_set(const FoundInf& f) {
  if (f.ptr == nullptr) return false;
  return f.is_int ? *static_cast<const int32_t*>(f.ptr) > 0 : *static_cast<const float*>(f.ptr) > 0.f;
}

inline FoundInf optional_flag(const std::optional<at::Tensor>& found_inf) {
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

inline DeviceScalar device_scalar_arg(const std::optional<at::Tensor>& t, at::Tensor& keep) {
  if (!t.has_value()) return {nullptr, false};
  const auto dtype = t->scalar_type();
  keep = (dtype == at::kFloat || dtype == at::kDouble) ? *t : t->to(at::kDouble);
  return {keep.data_ptr(), keep.scalar_type() == at::kDouble};
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

// steps: one-element float32 tensors on the current device (check_optimizer_group).
inline void advance_steps(at::TensorList steps, const FoundInf& found_inf) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  StepBatch batch;
  const int64_t n = static_cast<int64_t>(steps.size());
  for (int64_t first = 0; first < n; first += kStepsPerLaunch) {
    batch.count = std::min<int64_t>(kStepsPerLaunch, n - first);
    for (int64_t i = 0; i < batch.count; ++i) {
      batch.steps[i] = static_cast<float*>(steps[first + i].data_ptr());
    }
    const auto blocks = static_cast<unsigned>((batch.count + kStepBlock - 1) / kStepBlock);
    advance_steps_kernel<><<<blocks, kStepBlock, 0, stream>>>(batch, found_inf);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

// Note [Optimizer memory layout]: a dense tensor that is not contiguous (channels_last)
// still fills numel elements from its data pointer, laid out as its param (the checks
// made sure), so the launcher walks a flat alias of it. Contiguous lists, the usual
// case, are passed as they are: no new tensor per element.
struct FlatLists {
  std::vector<std::vector<at::Tensor>> storage;

  at::TensorList operator()(at::TensorList ts, bool needed) {
    if (!needed || ts.empty()) return ts;
    std::vector<at::Tensor> flat;
    flat.reserve(ts.size());
    for (const auto& t : ts) {
      flat.push_back(t.is_contiguous() ? t : t.as_strided({t.numel()}, {1}));
    }
    storage.push_back(std::move(flat));
    return storage.back();
  }
};

}  // namespace core_ops::cuda
