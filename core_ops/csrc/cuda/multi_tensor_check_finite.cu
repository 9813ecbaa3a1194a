// CUDA kernel of multi_tensor_check_finite_: the guards of
// csrc/cpu/multi_tensor_check_finite.cpp, the probe of core_ops/multi_tensor_math.h,
// and found_inf set on the device, so the host never waits.
#include <torch/csrc/stable/library.h>

#include <core_ops/dispatch.h>
#include <core_ops/multi_tensor_math.h>
#include <core_ops/tensor_lists.h>

#include "multi_tensor_apply.cuh"

namespace core_ops::cuda {
namespace {

template <typename T, typename acc_t>
struct CheckFiniteOp {
  FoundInf found_inf;

  __device__ void operator()(const TensorListMeta<1>& meta, int t, int64_t begin, int len,
                             int64_t) const {
    const T* x = static_cast<const T*>(meta.addresses[0][t]) + begin;
    const bool vec = pack_aligned(x);
    acc_t probe = 0;
    for_each_pack(len, [&](int i, int n) {
      acc_t v[kILP];
      load_pack(v, x + i, n, vec);
#pragma unroll
      for (int k = 0; k < kILP; ++k) probe += nonfinite_probe(v[k]);  // padding is 0
    });
    if (probe_failed(probe)) found_inf.set();
  }
};

void multi_tensor_check_finite_(TensorList tensors, const Tensor& found_inf) {
  if (!check_check_finite_args(tensors, found_inf)) return;
  const auto device = tensors[0].device();
  check_cuda(device);
  const DeviceGuard guard(device.index());

  ContiguousList ts(tensors, false);
  const FoundInf flag = found_inf_arg(found_inf);
  if (is_double_list(tensors)) {
    multi_tensor_apply<1>({ts.tensors}, CheckFiniteOp<double, double>{flag});
  } else {
    CORE_OPS_DISPATCH_FLOAT_HALF_BF16(dtype_of(tensors[0]), "tensors", scalar_t,
      multi_tensor_apply<1>({ts.tensors}, CheckFiniteOp<scalar_t, float>{flag}));
  }
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(core_ops, CUDA, m) {
  m.impl("multi_tensor_check_finite_", TORCH_BOX(&multi_tensor_check_finite_));
}

}  // namespace core_ops::cuda
