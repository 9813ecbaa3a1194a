// CUDA kernels of multi_tensor_l2norm and multi_tensor_unscale_l2norm_.
//
// Deterministic by construction, no atomics: every chunk writes its sum of squares
// (accumulated in float, double for float64 lists) to its own slot, indexed by global
// chunk id; then one block per tensor adds that tensor's consecutive slots, and one
// block adds the tensors, both in double and in a fixed order. The same inputs give
// the same bits on every run, whatever the scheduling.
#include <algorithm>
#include <optional>
#include <tuple>
#include <vector>

#include <torch/csrc/stable/library.h>

#include <core_ops/dispatch.h>
#include <core_ops/multi_tensor_math.h>
#include <core_ops/tensor.h>
#include <core_ops/tensor_lists.h>

#include "multi_tensor_apply.cuh"
#include "stream.cuh"

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
void finish_norms(const std::vector<int64_t>& starts, const Tensor& partial, const Tensor& total,
                  const Tensor& per, bool per_tensor, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(starts.size()) - 1;
  const Tensor tensor_sumsq = empty({n}, ScalarType::Double, partial.device());
  Segments seg;
  for (int64_t first = 0; first < n; first += kSegments) {
    const int64_t count = std::min<int64_t>(kSegments, n - first);
    seg.first_tensor = first;
    for (int64_t i = 0; i <= count; ++i) seg.chunk_start[i] = starts[first + i];
    per_tensor_kernel<acc_t><<<static_cast<unsigned>(count), kReduceBlock, 0, stream>>>(
        seg, data<acc_t>(partial), data<double>(tensor_sumsq), per_tensor ? data<acc_t>(per) : nullptr);
    check_launch("per_tensor_kernel");
  }
  total_kernel<acc_t><<<1, kReduceBlock, 0, stream>>>(data<double>(tensor_sumsq), n, data<acc_t>(total));
  check_launch("total_kernel");
}

std::tuple<Tensor, Tensor> empty_norms() {
  // An empty list names no device: CPU zeros, like the CPU kernel and the fake kernel.
  const Device cpu(DeviceType::CPU);
  return {zeros({}, ScalarType::Float, cpu), empty({0}, ScalarType::Float, cpu)};
}

template <bool kUnscale>
std::tuple<Tensor, Tensor> norm_impl(TensorList tensors, const Tensor* inv_scale, const Tensor* found_inf,
                                     bool per_tensor) {
  const Device device = tensors[0].device();
  check_cuda(device);
  CallDevice().list(tensors, "tensors");
  check_list(tensors, "tensors", device);
  const DeviceGuard guard(device.index());
  const cudaStream_t stream = current_stream(device.index());

  const bool is_double = is_double_list(tensors);
  const ScalarType acc = is_double ? ScalarType::Double : ScalarType::Float;
  const int64_t n = static_cast<int64_t>(tensors.size());
  const std::vector<int64_t> starts = chunk_starts(tensors);
  const Tensor partial = empty({starts.back()}, acc, device);
  const Tensor total = empty({}, acc, device);
  const Tensor per = empty({per_tensor ? n : 0}, acc, device);

  ContiguousList ts(tensors, kUnscale);
  const FoundInf flag = kUnscale ? found_inf_arg(*found_inf) : FoundInf{nullptr, false};
  // inv_scale as a device scalar of the math's dtype (kUnscale only).
  const OptionalTensor s = kUnscale ? OptionalTensor(device_scalar(*inv_scale, "inv_scale", device, acc))
                                    : std::nullopt;
  if (is_double) {
    multi_tensor_apply<1>({ts.tensors}, NormOp<double, double, kUnscale>{
        data<double>(partial), kUnscale ? data<double>(*s) : nullptr, flag});
    finish_norms<double>(starts, partial, total, per, per_tensor, stream);
  } else {
    CORE_OPS_DISPATCH_FLOAT_HALF_BF16(dtype_of(tensors[0]), "tensors", scalar_t,
      multi_tensor_apply<1>({ts.tensors}, NormOp<scalar_t, float, kUnscale>{
          data<float>(partial), kUnscale ? data<float>(*s) : nullptr, flag}));
    finish_norms<float>(starts, partial, total, per, per_tensor, stream);
  }
  ts.finish();
  return {total, per};
}

std::tuple<Tensor, Tensor> multi_tensor_l2norm(TensorList tensors, bool per_tensor) {
  if (tensors.empty()) return empty_norms();
  return norm_impl<false>(tensors, nullptr, nullptr, per_tensor);
}

std::tuple<Tensor, Tensor> multi_tensor_unscale_l2norm_(TensorList tensors, const Tensor& inv_scale,
                                                        const Tensor& found_inf, bool per_tensor) {
  if (!check_unscale_args(tensors, inv_scale, found_inf)) return empty_norms();
  return norm_impl<true>(tensors, &inv_scale, &found_inf, per_tensor);
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(core_ops, CUDA, m) {
  m.impl("multi_tensor_l2norm", TORCH_BOX(&multi_tensor_l2norm));
  m.impl("multi_tensor_unscale_l2norm_", TORCH_BOX(&multi_tensor_unscale_l2norm_));
}

}  // namespace core_ops::cuda
