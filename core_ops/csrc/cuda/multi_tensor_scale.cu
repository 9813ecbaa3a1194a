// CUDA kernels of multi_tensor_scale_ and multi_tensor_axpby_: the guards of
// csrc/cpu/multi_tensor_scale.cpp, the math of core_ops/multi_tensor_math.h, and
// scale / found_inf kept on the device so the host never waits.
#include <torch/csrc/stable/library.h>

#include <core_ops/dispatch.h>
#include <core_ops/multi_tensor_math.h>
#include <core_ops/tensor_lists.h>

#include "multi_tensor_apply.cuh"

namespace core_ops::cuda {
namespace {

// dst = src * scale over one chunk, probing src.
template <typename in_t, typename out_t, typename acc_t>
struct ScaleOp {
  const acc_t* scale;
  FoundInf found_inf;

  __device__ void operator()(const TensorListMeta<2>& meta, int t, int64_t begin, int len,
                             int64_t) const {
    const in_t* x = static_cast<const in_t*>(meta.addresses[0][t]) + begin;
    out_t* y = static_cast<out_t*>(meta.addresses[1][t]) + begin;
    const bool vec = pack_aligned(x) && pack_aligned(y);
    const acc_t s = *scale;
    acc_t probe = 0;
    for_each_pack(len, [&](int i, int n) {
      acc_t v[kILP];
      load_pack(v, x + i, n, vec);
#pragma unroll
      for (int k = 0; k < kILP; ++k) {
        probe += nonfinite_probe(v[k]);  // padding beyond n is 0: probes clean
        v[k] = scale_math(v[k], s);
      }
      store_pack(y + i, v, n, vec);
    });
    if (probe_failed(probe)) found_inf.set();
  }
};

// out = a*x + b*y over one chunk; arg_to_check picks which inputs may set the flag.
template <typename x_t, typename y_t, typename out_t, typename acc_t>
struct AxpbyOp {
  acc_t a, b;
  FoundInf found_inf;
  int arg_to_check;

  __device__ void operator()(const TensorListMeta<3>& meta, int t, int64_t begin, int len,
                             int64_t) const {
    const x_t* x = static_cast<const x_t*>(meta.addresses[0][t]) + begin;
    const y_t* y = static_cast<const y_t*>(meta.addresses[1][t]) + begin;
    out_t* out = static_cast<out_t*>(meta.addresses[2][t]) + begin;
    const bool vec = pack_aligned(x) && pack_aligned(y) && pack_aligned(out);
    acc_t px = 0, py = 0;
    for_each_pack(len, [&](int i, int n) {
      acc_t xv[kILP], yv[kILP], r[kILP];
      load_pack(xv, x + i, n, vec);
      load_pack(yv, y + i, n, vec);
#pragma unroll
      for (int k = 0; k < kILP; ++k) {
        px += nonfinite_probe(xv[k]);
        py += nonfinite_probe(yv[k]);
        r[k] = axpby_math(a, xv[k], b, yv[k]);
      }
      store_pack(out + i, r, n, vec);
    });
    if ((arg_to_check != 1 && probe_failed(px)) || (arg_to_check != 0 && probe_failed(py))) {
      found_inf.set();
    }
  }
};

void multi_tensor_scale_(TensorList src, TensorList dst, const Tensor& scale,
                         const Tensor& found_inf) {
  if (!check_scale_args(src, dst, scale, found_inf)) return;
  const auto device = src[0].device();
  check_cuda(device);
  const DeviceGuard guard(device.index());

  ContiguousList in(src, false), out(dst, true);
  const FoundInf flag = found_inf_arg(found_inf);
  if (all_or_no_double({src, dst}, "src and dst")) {
    const Tensor s = device_scalar(scale, "scale", device, ScalarType::Double);
    multi_tensor_apply<2>({in.tensors, out.tensors}, ScaleOp<double, double, double>{data<double>(s), flag});
  } else {
    const Tensor s = device_scalar(scale, "scale", device, ScalarType::Float);
    CORE_OPS_DISPATCH_FLOAT_HALF_BF16(dtype_of(src[0]), "src", in_t,
      CORE_OPS_DISPATCH_FLOAT_HALF_BF16(dtype_of(dst[0]), "dst", out_t,
        multi_tensor_apply<2>({in.tensors, out.tensors},
                              ScaleOp<in_t, out_t, float>{data<float>(s), flag})));
  }
  out.finish();
}

void multi_tensor_axpby_(TensorList x, TensorList y, TensorList out_list,
                         double a, double b, const Tensor& found_inf,
                         int64_t arg_to_check) {
  if (!check_axpby_args(x, y, out_list, found_inf, arg_to_check)) return;
  const auto device = x[0].device();
  check_cuda(device);
  const DeviceGuard guard(device.index());

  ContiguousList xs(x, false), ys(y, false), outs(out_list, true);
  const FoundInf flag = found_inf_arg(found_inf);
  const int check = static_cast<int>(arg_to_check);
  if (all_or_no_double({x, y, out_list}, "x, y and out")) {
    multi_tensor_apply<3>({xs.tensors, ys.tensors, outs.tensors},
                          AxpbyOp<double, double, double, double>{a, b, flag, check});
  } else {
    const float af = static_cast<float>(a), bf = static_cast<float>(b);
    CORE_OPS_DISPATCH_FLOAT_HALF_BF16(dtype_of(x[0]), "x", x_t,
      CORE_OPS_DISPATCH_FLOAT_HALF_BF16(dtype_of(y[0]), "y", y_t,
        CORE_OPS_DISPATCH_FLOAT_HALF_BF16(dtype_of(out_list[0]), "out", out_t,
          multi_tensor_apply<3>({xs.tensors, ys.tensors, outs.tensors},
                                AxpbyOp<x_t, y_t, out_t, float>{af, bf, flag, check}))));
  }
  outs.finish();
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(core_ops, CUDA, m) {
  m.impl("multi_tensor_scale_", TORCH_BOX(&multi_tensor_scale_));
  m.impl("multi_tensor_axpby_", TORCH_BOX(&multi_tensor_axpby_));
}

}  // namespace core_ops::cuda
