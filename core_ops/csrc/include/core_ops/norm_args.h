// Host-side pieces of the norm ops shared by csrc/cpu/norms.cpp and csrc/cuda/norms.cu
// (Note [Norm ops] in _schemas.py): the argument checks, worded as
// _validate.check_norm_args; the params in the accumulation dtype; and the four ops'
// entry points over a device's two launchers, norm_fwd and norm_bwd, and their
// registration.
#pragma once

#include <initializer_list>
#include <optional>
#include <tuple>
#include <utility>

#include <torch/csrc/stable/library.h>

#include <core_ops/dispatch.h>
#include <core_ops/tensor.h>

namespace core_ops {

inline void check_norm_args(const Tensor& input, int64_t hidden,
                            std::initializer_list<std::pair<const char*, const OptionalTensor*>> params,
                            std::optional<ScalarType> out_dtype = std::nullopt, const char* name = "input") {
  CORE_OPS_CHECK_TYPE(is_floating(dtype_of(input)), name, " must be a floating-point tensor, got ",
                      dtype_name(dtype_of(input)));
  CORE_OPS_CHECK_VALUE(hidden >= 1 && (input.numel() % hidden == 0), name, " of shape ", input.sizes(),
                       " does not hold whole rows of hidden=", hidden, " values");
  for (const auto& [pname, p] : params) {
    if (!p->has_value()) continue;
    const Tensor& t = p->value();
    CORE_OPS_CHECK_VALUE(t.numel() == hidden, pname, " has ", t.numel(), " elements; expected hidden=", hidden);
    CORE_OPS_CHECK_VALUE(t.device() == input.device(), pname, " is on ", t.device(), ", ", name, " on ",
                         input.device());
    CORE_OPS_CHECK_TYPE(is_floating(dtype_of(t)), pname, " must be floating-point, got ",
                        dtype_name(dtype_of(t)));
  }
  if (out_dtype.has_value() && *out_dtype != dtype_of(input)) {
    const bool half = dtype_of(input) == ScalarType::Half || dtype_of(input) == ScalarType::BFloat16;
    CORE_OPS_CHECK_TYPE(*out_dtype == ScalarType::Float && half, "out_dtype must be ", name, "'s dtype (",
                        dtype_name(dtype_of(input)), ") or, for half input, torch.float32; got ",
                        dtype_name(*out_dtype));
  }
}

// The backwards' other inputs, worded as _validate.check_norm_bwd_args: the kernels
// index grad_out like saved and the statistics by row, unchecked.
inline void check_norm_bwd_args(const Tensor& grad_out, const Tensor& saved,
                                std::initializer_list<std::pair<const char*, const Tensor*>> stats,
                                int64_t hidden, ScalarType dx_dtype, bool memory_efficient) {
  // The dtypes first, on every call: an empty batch runs no kernel that would check them.
  CORE_OPS_CHECK_TYPE(dx_dtype == ScalarType::Float || dx_dtype == ScalarType::Half ||
                          dx_dtype == ScalarType::BFloat16 || dx_dtype == ScalarType::Double,
                      "dx_dtype must be float32, float16, bfloat16 or float64, got ", dtype_name(dx_dtype));
  const ScalarType out_type = dtype_of(grad_out);
  CORE_OPS_CHECK_TYPE(out_type == dx_dtype || (out_type == ScalarType::Float && dx_dtype != ScalarType::Double),
                      "grad_out must be the input's dtype or, for half input, torch.float32; got ",
                      dtype_name(out_type));
  CORE_OPS_CHECK_TYPE(dtype_of(saved) == (memory_efficient ? out_type : dx_dtype), "saved must be the ",
                      memory_efficient ? "output's" : "input's", " dtype; got ", dtype_name(dtype_of(saved)));
  CORE_OPS_CHECK_VALUE(grad_out.numel() == saved.numel() && grad_out.device() == saved.device(), "grad_out has ",
                       grad_out.numel(), " elements on ", grad_out.device(), "; expected ", saved.numel(), " on ",
                       saved.device(), ", as saved");
  const int64_t rows = hidden >= 1 ? saved.numel() / hidden : 0;
  const ScalarType acc = dx_dtype == ScalarType::Double ? ScalarType::Double : ScalarType::Float;
  for (const auto& [name, t] : stats) {
    CORE_OPS_CHECK_VALUE(t->numel() == rows && dtype_of(*t) == acc && t->device() == saved.device(), name,
                         " must hold ", rows, " ", dtype_name(acc), " values (one per row) on ", saved.device(),
                         ", got ", t->numel(), " ", dtype_name(dtype_of(*t)), " on ", t->device());
  }
}

inline void check_residual(const Tensor& input, const Tensor& residual) {
  CORE_OPS_CHECK_VALUE(residual.sizes().equals(input.sizes()) && dtype_of(residual) == dtype_of(input) &&
                           residual.device() == input.device(),
                       "residual must match input: got ", residual.sizes(), " ", dtype_name(dtype_of(residual)),
                       " on ", residual.device(), ", input ", input.sizes(), " ", dtype_name(dtype_of(input)),
                       " on ", input.device());
}

// A weight or bias as `n` contiguous values of the accumulation dtype; ones / zeros
// (fill) when absent, so the kernels need no branch for it.
inline Tensor acc_param(const OptionalTensor& p, int64_t n, ScalarType acc, double fill, const Tensor& like) {
  // The kernels read n values from the data: a weight already in the accumulation dtype
  // is used as it is, with no call into torch (each one costs microseconds a call).
  if (p.has_value() && dtype_of(*p) == acc && p->is_contiguous()) return *p;
  if (p.has_value()) return core_ops::contiguous(torch::stable::to(*p, acc));
  Tensor t = core_ops::empty({n}, acc, like.device());
  torch::stable::fill_(t, fill);
  return t;
}

using Tensor3 = std::tuple<Tensor, Tensor, Tensor>;

// A norm backward over no rows: dx (already made, empty) and zero grads for the params
// given, (0,) tensors for those not. Taken before anything of `hidden` values is made:
// with no rows, hidden may be any size (the reference returns at once; a (0, 2**40)
// input once made the CPU kernel ask for 8 TB).
inline Tensor3 no_rows_backward(const Tensor& dx, const OptionalTensor& weight, const OptionalTensor& bias,
                                const Tensor& saved) {
  const auto zero = [&](const OptionalTensor& p) {
    if (!p.has_value()) return core_ops::empty({0}, dtype_of(saved), saved.device());
    Tensor t = core_ops::empty(p->sizes(), dtype_of(*p), saved.device());
    torch::stable::fill_(t, 0.0);
    return t;
  };
  return {dx, zero(weight), zero(bias)};
}
using OptTensor = OptionalTensor;

// fused_add_rms_norm_fwd's checked, contiguous inputs, its outputs (y, h, rstd) and the
// weight in the accumulation dtype, for either device's kernel (on CUDA, allocate
// under the input's device guard).
struct AddRmsNormIo {
  Tensor x, residual, y, h, rstd, w;
  int64_t rows;
};

inline AddRmsNormIo add_rms_norm_io(const Tensor& input, const Tensor& residual, const OptTensor& weight,
                                    int64_t hidden) {
  check_norm_args(input, hidden, {{"weight", &weight}});
  check_residual(input, residual);
  const Tensor x = core_ops::contiguous(input);
  const ScalarType acc = dtype_of(x) == ScalarType::Double ? ScalarType::Double : ScalarType::Float;
  const int64_t rows = x.numel() / hidden;
  const auto like_x = [&] { return core_ops::empty(input.sizes(), dtype_of(x), x.device()); };
  return {x, core_ops::contiguous(residual), like_x(), like_x(), core_ops::empty({rows}, acc, x.device()),
          acc_param(weight, hidden, acc, 1, x), rows};
}
using NormFwd = Tensor3 (*)(const Tensor&, const OptTensor&, const OptTensor&, int64_t, double,
                            std::optional<ScalarType>, bool rms);
using NormBwd = Tensor3 (*)(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                            const OptTensor&, const OptTensor&, int64_t, bool, ScalarType, bool rms);

// The ops' schemas over a device's launchers (`memory_efficient` of the forwards only
// tells their autograd what to keep). Every argument is checked here, once for both
// devices, before a launcher runs (Note [Norm checks before dispatch] in
// normalization/fused.py).
template <NormFwd fwd>
Tensor3 layer_norm_fwd(const Tensor& input, const OptTensor& weight, const OptTensor& bias, int64_t hidden,
                       double eps, std::optional<ScalarType> out_dtype, bool /*memory_efficient*/) {
  check_norm_args(input, hidden, {{"weight", &weight}, {"bias", &bias}}, out_dtype);
  return fwd(input, weight, bias, hidden, eps, out_dtype, false);
}

template <NormFwd fwd>
std::tuple<Tensor, Tensor> rms_norm_fwd(const Tensor& input, const OptTensor& weight, int64_t hidden,
                                                double eps, std::optional<ScalarType> out_dtype,
                                                bool /*memory_efficient*/) {
  check_norm_args(input, hidden, {{"weight", &weight}}, out_dtype);
  auto [out, mean, rstd] = fwd(input, weight, std::nullopt, hidden, eps, out_dtype, true);
  return {out, rstd};
}

template <NormBwd bwd>
Tensor3 layer_norm_bwd(const Tensor& grad_out, const Tensor& saved, const Tensor& mean,
                       const Tensor& rstd, const OptTensor& weight, const OptTensor& bias, int64_t hidden,
                       bool memory_efficient, ScalarType dx_dtype) {
  check_norm_args(saved, hidden, {{"weight", &weight}, {"bias", &bias}}, std::nullopt, "saved");
  check_norm_bwd_args(grad_out, saved, {{"mean", &mean}, {"rstd", &rstd}}, hidden, dx_dtype, memory_efficient);
  return bwd(grad_out, saved, mean, rstd, weight, bias, hidden, memory_efficient, dx_dtype, false);
}

template <NormBwd bwd>
std::tuple<Tensor, Tensor> rms_norm_bwd(const Tensor& grad_out, const Tensor& saved,
                                                const Tensor& rstd, const OptTensor& weight, int64_t hidden,
                                                bool memory_efficient, ScalarType dx_dtype) {
  check_norm_args(saved, hidden, {{"weight", &weight}}, std::nullopt, "saved");
  check_norm_bwd_args(grad_out, saved, {{"rstd", &rstd}}, hidden, dx_dtype, memory_efficient);
  auto [dx, dw, db] = bwd(grad_out, saved, rstd, rstd, weight, std::nullopt, hidden, memory_efficient, dx_dtype, true);
  return {dx, dw};
}

using AddRmsNormFwd = Tensor3 (*)(const Tensor&, const Tensor&, const OptTensor&, int64_t, double,
                                  bool memory_efficient);

// The five norm kernels of a device, for its STABLE_TORCH_LIBRARY_IMPL(core_ops, <Device>, m)
// (on the CPU, CORE_OPS_CPU_KERNELS(m)).
template <NormFwd fwd, NormBwd bwd, AddRmsNormFwd add_fwd>
void register_norm_kernels(torch::stable::detail::StableLibrary& m) {
  m.impl("layer_norm_fwd", TORCH_BOX(&layer_norm_fwd<fwd>));
  m.impl("layer_norm_bwd", TORCH_BOX(&layer_norm_bwd<bwd>));
  m.impl("rms_norm_fwd", TORCH_BOX(&rms_norm_fwd<fwd>));
  m.impl("rms_norm_bwd", TORCH_BOX(&rms_norm_bwd<bwd>));
  m.impl("fused_add_rms_norm_fwd", TORCH_BOX(add_fwd));
}

}  // namespace core_ops
