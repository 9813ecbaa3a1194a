// CUDA kernels of multi_tensor_l2norm and multi_tensor_unscale_l2norm_.
//
// Deterministic by construction, no atomics: every chunk writes its sum of squares
// (accumulated in float, double for float64 lists) to its own slot, indexed by global
// chunk id; then one block per tensor adds that tensor's consecutive slots, and one
// block adds the tensors, both in double and in a fixed order. The same inputs give
// the same bits on every run, whatever the scheduling.
#include <algorithm>

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <core_ops/dispatch.h>
#include <core_ops/multi_tensor_math.h>
#include <core_ops/tensor_lists.h>

#include "multi_tensor_apply.cuh"

namespace core_ops::cuda {
namespace {

// Sum of squares of each chunk into partial[global chunk id]. kUnscale also multiplies
// by inv_scale in place, probes the inputs, and squares the unscaled values before
// they are rounded to the tensor's dtype.
template <typename T, typename acc_t, bool kUnscale>
struct NormOp {
  acc_t* partial;
  const acc_t* inv_scale;  // kUnscale only
  FoundInf found_inf;      // kUnscale only

  __device__ void operator()(const TensorListMeta<1>& meta, int t, int64_t begin, int len,
                             int64_t chunk_id) const {
    T* p = static_cast<T*>(meta.addresses[0][t]) + begin;
    const bool vec = pack_aligned(p);
    acc_t s = 1;
    if constexpr (kUnscale) s = *inv_scale;
    acc_t probe = 0, sumsq = 0;
    for_each_pack(len, [&](int i, int n) {
      acc_t v[kILP];
      load_pack(v, p + i, n, vec);
#pragma unroll
      for (int k = 0; k < kILP; ++k) {
        if constexpr (kUnscale) {
          probe += nonfinite_probe(v[k]);
          v[k] = scale_math(v[k], s);
        }
        // Padding is skipped, not trusted to be 0: 0 * inf inv_scale is nan.
        if (k < n) sumsq += square_math(v[k]);
      }
      if constexpr (kUnscale) store_pack(p + i, v, n, vec);
    });
    if constexpr (kUnscale) {
      if (probe_failed(probe)) found_inf.set();
    }
    sumsq = block_sum(sumsq);
    if (threadIdx.x == 0) partial[chunk_id] = sumsq;
  }
};

constexpr int kReduceBlock = 512;

// Tensors one per-tensor launch covers: their chunk ranges fill the argument budget.
constexpr int kSegments = (kMetaBytes - 2 * sizeof(int64_t)) / sizeof(int64_t) - 1;

struct Segments {
  int64_t first_tensor;
  int64_t chunk_start[kSegments + 1];  // tensor first_tensor + i owns [start[i], start[i+1])
};

// One block per tensor: its chunks' partial sums, then its norm.
template <typename acc_t>
__global__ void __launch_bounds__(kReduceBlock)
    per_tensor_kernel(const __grid_constant__ Segments seg, const acc_t* partial,
                      double* tensor_sumsq, acc_t* per_norm) {
  const int64_t end = seg.chunk_start[blockIdx.x + 1];
  double s = 0;
  for (int64_t c = seg.chunk_start[blockIdx.x] + threadIdx.x; c < end; c += blockDim.x) {
    s += static_cast<double>(partial[c]);
  }
  s = block_sum(s);
  if (threadIdx.x == 0) {
    const int64_t t = seg.first_tensor + blockIdx.x;
    tensor_sumsq[t] = s;
    if (per_norm != nullptr) per_norm[t] = static_cast<acc_t>(sqrt(s));
  }
}

template <typename acc_t>
__global__ void __launch_bounds__(kReduceBlock)
    total_kernel(const double* tensor_sumsq, int64_t n, acc_t* total) {
  double s = 0;
  for (int64_t t = threadIdx.x; t < n; t += blockDim.x) s += tensor_sumsq[t];
  s = block_sum(s);
  if (threadIdx.x == 0) *total = static_cast<acc_t>(sqrt(s));
}

// partial (one slot per chunk, laid out by chunk_starts) -> (total, per-tensor) norms.
template <typename acc_t>
void finish_norms(const std::vector<int64_t>& starts, const at::Tensor& partial,
                  const at::Tensor& total, const at::Tensor& per, bool per_tensor) {
  const int64_t n = static_cast<int64_t>(starts.size()) - 1;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  at::Tensor tensor_sumsq = at::empty({n}, partial.options().dtype(at::kDouble));
  Segments seg;
  for (int64_t first = 0; first < n; first += kSegments) {
    const int64_t count = std::min<int64_t>(kSegments, n - first);
    seg.first_tensor = first;
    for (int64_t i = 0; i <= count; ++i) seg.chunk_start[i] = starts[first + i];
    per_tensor_kernel<acc_t><<<static_cast<unsigned>(count), kReduceBlock, 0, stream>>>(
        seg, partial.data_ptr<acc_t>(), tensor_sumsq.data_ptr<double>(),
        per_tensor ? per.data_ptr<acc_t>() : nullptr);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  total_kernel<acc_t><<<1, kReduceBlock, 0, stream>>>(tensor_sumsq.data_ptr<double>(), n,
                                                      total.data_ptr<acc_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

std::tuple<at::Tensor, at::Tensor> empty_norms() {
  // An empty list names no device: CPU zeros, like the CPU kernel and the fake kernel.
  auto opts = at::TensorOptions().dtype(at::kFloat);
  return {at::zeros({}, opts), at::empty({0}, opts)};
}

template <bool kUnscale>
std::tuple<at::Tensor, at::Tensor> norm_impl(at::TensorList tensors, const at::Tensor* inv_scale,
                                             const at::Tensor* found_inf, bool per_tensor) {
  const auto device = tensors[0].device();
  check_cuda(device);
  check_list(tensors, "tensors", device);
  if constexpr (kUnscale) check_flag(*found_inf, device);
  const c10::cuda::CUDAGuard guard(device);

  const bool is_double = is_double_list(tensors);
  const auto acc = is_double ? at::kDouble : at::kFloat;
  const auto opts = at::TensorOptions().device(device).dtype(acc);
  const int64_t n = static_cast<int64_t>(tensors.size());
  const std::vector<int64_t> starts = chunk_starts(tensors);
  at::Tensor partial = at::empty({starts.back()}, opts);
  at::Tensor total = at::empty({}, opts);
  at::Tensor per = at::empty({per_tensor ? n : 0}, opts);

  ContiguousList ts(tensors, kUnscale);
  const FoundInf flag = kUnscale ? found_inf_arg(*found_inf) : FoundInf{nullptr, false};
  if (is_double) {
    at::Tensor s;
    if constexpr (kUnscale) s = device_scalar(*inv_scale, "inv_scale", device, at::kDouble);
    multi_tensor_apply<1>({ts.tensors}, NormOp<double, double, kUnscale>{
        partial.data_ptr<double>(), kUnscale ? s.data_ptr<double>() : nullptr, flag});
    finish_norms<double>(starts, partial, total, per, per_tensor);
  } else {
    at::Tensor s;
    if constexpr (kUnscale) s = device_scalar(*inv_scale, "inv_scale", device, at::kFloat);
    CORE_OPS_DISPATCH_FLOAT_HALF_BF16(tensors[0].scalar_type(), "tensors", scalar_t,
      multi_tensor_apply<1>({ts.tensors}, NormOp<scalar_t, float, kUnscale>{
          partial.data_ptr<float>(), kUnscale ? s.data_ptr<float>() : nullptr, flag}));
    finish_norms<float>(starts, partial, total, per, per_tensor);
  }
  ts.finish();
  return {total, per};
}

std::tuple<at::Tensor, at::Tensor> multi_tensor_l2norm(at::TensorList tensors, bool per_tensor) {
  if (tensors.empty()) return empty_norms();
  return norm_impl<false>(tensors, nullptr, nullptr, per_tensor);
}

std::tuple<at::Tensor, at::Tensor> multi_tensor_unscale_l2norm_(
    at::TensorList tensors, const at::Tensor& inv_scale, const at::Tensor& found_inf,
    bool per_tensor) {
  if (tensors.empty()) return empty_norms();
  return norm_impl<true>(tensors, &inv_scale, &found_inf, per_tensor);
}

}  // namespace

TORCH_LIBRARY_IMPL(core_ops, CUDA, m) {
  m.impl("multi_tensor_l2norm", &multi_tensor_l2norm);
  m.impl("multi_tensor_unscale_l2norm_", &multi_tensor_unscale_l2norm_);
}

}  // namespace core_ops::cuda
