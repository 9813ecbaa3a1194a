// The autograd of the norm ops in C++ (Note [Norm ops] in _library.py). Each device's
// native library registers it at that device's autograd key (csrc/cpu/norm_autograd.cpp,
// csrc/cuda/norm_autograd.cpp). normalization/fused.py registers the same formulas in
// Python at the Autograd alias key, which serves the reference kernels; a kernel at a
// device's own key takes precedence over the alias, so once a native library is
// loaded its norms skip Python: torch.library's Python autograd cost about 100 us per
// forward + backward (bench/README, "Norm autograd in C++"), more than the kernels of
// a small norm take, and on a GPU more than the kernels of a large one.
// The forwards and backwards call the ops through the dispatcher, so these functions
// work over whichever kernel a device has.
#pragma once

#include <optional>
#include <tuple>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/add.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <core_ops/norm_args.h>

namespace core_ops::norm_autograd {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptDtype = std::optional<at::ScalarType>;
using Tensor2 = std::tuple<at::Tensor, at::Tensor>;

// The ops' dispatcher handles, looked up once.
template <typename Signature>
c10::TypedOperatorHandle<Signature> find(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}
#define CORE_OPS_NORM_OP(fn, name, ...)                              \
  inline const c10::TypedOperatorHandle<__VA_ARGS__>& fn() {         \
    static const auto h = find<__VA_ARGS__>("core_ops::" name);      \
    return h;                                                        \
  }
CORE_OPS_NORM_OP(layer_norm_fwd_op, "layer_norm_fwd",
                 Tensor3(const at::Tensor&, const OptTensor&, const OptTensor&, int64_t, double, OptDtype, bool))
CORE_OPS_NORM_OP(layer_norm_bwd_op, "layer_norm_bwd",
                 Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const OptTensor&,
                         const OptTensor&, int64_t, bool, at::ScalarType))
CORE_OPS_NORM_OP(rms_norm_fwd_op, "rms_norm_fwd",
                 Tensor2(const at::Tensor&, const OptTensor&, int64_t, double, OptDtype, bool))
CORE_OPS_NORM_OP(rms_norm_bwd_op, "rms_norm_bwd",
                 Tensor2(const at::Tensor&, const at::Tensor&, const at::Tensor&, const OptTensor&, int64_t, bool,
                         at::ScalarType))
CORE_OPS_NORM_OP(fused_add_rms_norm_fwd_op, "fused_add_rms_norm_fwd",
                 Tensor3(const at::Tensor&, const at::Tensor&, const OptTensor&, int64_t, double, bool))
#undef CORE_OPS_NORM_OP

// Saved weights and biases: an undefined tensor stands for an absent one.
inline at::Tensor saved_opt(const OptTensor& t) { return t.value_or(at::Tensor()); }
inline OptTensor opt(const at::Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }
inline at::Tensor if_defined(const at::Tensor& param, const at::Tensor& grad) {
  return param.defined() ? grad : at::Tensor();
}

// What every backward needs besides the saved tensors.
inline void save_config(AutogradContext* ctx, int64_t hidden, bool memory_efficient, at::ScalarType dx_dtype) {
  ctx->saved_data["hidden"] = hidden;
  ctx->saved_data["memory_efficient"] = memory_efficient;
  ctx->saved_data["dx_dtype"] = static_cast<int64_t>(dx_dtype);
  // An unused output's grad arrives undefined instead of as a tensor of zeros.
  ctx->set_materialize_grads(false);
}
struct Config {
  int64_t hidden;
  bool memory_efficient;
  at::ScalarType dx_dtype;
};
inline Config config(AutogradContext* ctx) {
  return {ctx->saved_data["hidden"].toInt(), ctx->saved_data["memory_efficient"].toBool(),
          static_cast<at::ScalarType>(ctx->saved_data["dx_dtype"].toInt())};
}

struct LayerNorm : torch::autograd::Function<LayerNorm> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, const OptTensor& weight,
                               const OptTensor& bias, int64_t hidden, double eps, OptDtype out_dtype,
                               bool memory_efficient) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [out, mean, rstd] = layer_norm_fwd_op().call(input, weight, bias, hidden, eps, out_dtype, memory_efficient);
    ctx->save_for_backward({memory_efficient ? out : input, mean, rstd, saved_opt(weight), saved_opt(bias)});
    save_config(ctx, hidden, memory_efficient, input.scalar_type());
    ctx->mark_non_differentiable({mean, rstd});
    return {out, mean, rstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return variable_list(7);  // the output was not used
    const auto s = ctx->get_saved_variables();
    const Config c = config(ctx);
    auto [dx, dw, db] =
        layer_norm_bwd_op().call(grads[0], s[0], s[1], s[2], opt(s[3]), opt(s[4]), c.hidden, c.memory_efficient,
                                 c.dx_dtype);
    return {dx, if_defined(s[3], dw), if_defined(s[4], db), {}, {}, {}, {}};
  }
};

struct RmsNorm : torch::autograd::Function<RmsNorm> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, const OptTensor& weight, int64_t hidden,
                               double eps, OptDtype out_dtype, bool memory_efficient) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [out, rstd] = rms_norm_fwd_op().call(input, weight, hidden, eps, out_dtype, memory_efficient);
    ctx->save_for_backward({memory_efficient ? out : input, rstd, saved_opt(weight)});
    save_config(ctx, hidden, memory_efficient, input.scalar_type());
    ctx->mark_non_differentiable({rstd});
    return {out, rstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return variable_list(6);
    const auto s = ctx->get_saved_variables();
    const Config c = config(ctx);
    auto [dx, dw] = rms_norm_bwd_op().call(grads[0], s[0], s[1], opt(s[2]), c.hidden, c.memory_efficient, c.dx_dtype);
    return {dx, if_defined(s[2], dw), {}, {}, {}, {}};
  }
};

struct FusedAddRmsNorm : torch::autograd::Function<FusedAddRmsNorm> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& residual,
                               const OptTensor& weight, int64_t hidden, double eps, bool memory_efficient) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [y, h, rstd] = fused_add_rms_norm_fwd_op().call(input, residual, weight, hidden, eps, memory_efficient);
    ctx->save_for_backward({memory_efficient ? y : h, rstd, saved_opt(weight)});
    save_config(ctx, hidden, memory_efficient, input.scalar_type());
    ctx->mark_non_differentiable({rstd});
    return {y, h, rstd};
  }

  // h = input + residual feeds y's norm and is an output too: its grad is the norm's
  // input grad plus h's own, and it reaches input and residual alike.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor &gy = grads[0], &gh = grads[1];
    const auto s = ctx->get_saved_variables();
    at::Tensor dh, dw;
    if (gy.defined()) {
      const Config c = config(ctx);
      std::tie(dh, dw) = rms_norm_bwd_op().call(gy, s[0], s[1], opt(s[2]), c.hidden, c.memory_efficient, c.dx_dtype);
      if (gh.defined()) dh = at::add(dh, gh);
    } else {
      dh = gh;
    }
    return {dh, dh, if_defined(s[2], dw), {}, {}, {}};
  }
};

// The forwards check their arguments before apply builds a node (Note [Norm checks
// before dispatch] in normalization/fused.py); the kernels check them again. Traced
// with dynamic shapes (torch.compile, AOT dispatch) the sizes are symbolic and cannot
// be read here: the fake kernels (_library.py) check them then.
inline bool symbolic(const at::Tensor& t) { return t.unsafeGetTensorImpl()->has_symbolic_sizes_strides(); }
inline bool symbolic(const OptTensor& t) { return t.has_value() && symbolic(*t); }

inline Tensor3 layer_norm_fwd(const at::Tensor& input, const OptTensor& weight, const OptTensor& bias, int64_t hidden,
                              double eps, OptDtype out_dtype, bool memory_efficient) {
  if (!symbolic(input) && !symbolic(weight) && !symbolic(bias)) {
    check_norm_args(input, hidden, {{"weight", &weight}, {"bias", &bias}}, out_dtype);
  }
  auto r = LayerNorm::apply(input, weight, bias, hidden, eps, out_dtype, memory_efficient);
  return {r[0], r[1], r[2]};
}

inline Tensor2 rms_norm_fwd(const at::Tensor& input, const OptTensor& weight, int64_t hidden, double eps,
                            OptDtype out_dtype, bool memory_efficient) {
  if (!symbolic(input) && !symbolic(weight)) check_norm_args(input, hidden, {{"weight", &weight}}, out_dtype);
  auto r = RmsNorm::apply(input, weight, hidden, eps, out_dtype, memory_efficient);
  return {r[0], r[1]};
}

inline Tensor3 fused_add_rms_norm_fwd(const at::Tensor& input, const at::Tensor& residual, const OptTensor& weight,
                                      int64_t hidden, double eps, bool memory_efficient) {
  if (!symbolic(input) && !symbolic(residual) && !symbolic(weight)) {
    check_norm_args(input, hidden, {{"weight", &weight}});
    check_residual(input, residual);
  }
  auto r = FusedAddRmsNorm::apply(input, residual, weight, hidden, eps, memory_efficient);
  return {r[0], r[1], r[2]};
}

// The forwards' autograd kernels, for TORCH_LIBRARY_IMPL(core_ops, Autograd<Device>, m).
inline void register_kernels(torch::Library& m) {
  m.impl("layer_norm_fwd", &layer_norm_fwd);
  m.impl("rms_norm_fwd", &rms_norm_fwd);
  m.impl("fused_add_rms_norm_fwd", &fused_add_rms_norm_fwd);
}

}  // namespace core_ops::norm_autograd
