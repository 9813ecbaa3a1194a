// Argument checks of the fused optimizer ops, shared by their CPU and CUDA kernels.
// Worded as core_ops/_validate.py's check_optimizer_lists, which serves the reference
// and fake kernels.
#pragma once

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <utility>
#include <vector>

#include <core_ops/tensor.h>
#include <core_ops/tensor_lists.h>

namespace core_ops {

// The dtype optimizer state and master weights are kept in for params of `param`.
inline ScalarType state_dtype(ScalarType param) {
  return param == ScalarType::Double ? ScalarType::Double : ScalarType::Float;
}

inline void check_state_list(TensorList params, TensorList ts, const char* name,
                             bool optional) {
  if (optional && ts.empty()) return;
  check_same_length(params, "params", ts, name);
  if (params.empty()) return;
  check_list(ts, name, params[0].device());
  check_same_numel(params, "params", ts, name);
  const auto want = state_dtype(dtype_of(params[0]));
  CORE_OPS_CHECK_TYPE(dtype_of(ts[0]) == want, name, " must be ", dtype_name(want),
                      " for ", dtype_name(dtype_of(params[0])), " params, got ",
                      dtype_name(dtype_of(ts[0])));
}

// Master weights are float32 copies of reduced-precision params.
inline void check_masters(TensorList params, TensorList masters) {
  check_state_list(params, masters, "master_params", true);
  CORE_OPS_CHECK_VALUE(masters.empty() || dtype_of(params[0]) != ScalarType::Double,
                       "float64 params take no master_params");
}

// Note [Optimizer memory layout]: the kernels walk each tensor's memory as one flat
// array, so every params[i] must be dense (contiguous, channels_last, ...) and its
// state tensors laid out alike (the optimizers create them with zeros_like). A grad
// laid out otherwise is copied into the param's layout first.
inline void check_layouts(TensorList params, std::initializer_list<std::pair<TensorList, const char*>> states) {
  for (size_t i = 0; i < params.size(); ++i) {
    CORE_OPS_CHECK_VALUE(is_dense(params[i]), "params[", i,
                         "] must be dense (contiguous or a permutation of it), got strides ",
                         params[i].strides());
    for (const auto& [ts, name] : states) {
      if (ts.empty()) continue;
      CORE_OPS_CHECK_VALUE(same_layout(ts[i], params[i]), name, "[", i,
                           "] must have the strides of params[", i, "] ", params[i].strides(),
                           ", got ", ts[i].strides());
    }
  }
}

// `like`: where the grads' dtype is not the params' (Note [Master grads]), tensors of
// the grads' dtype laid out as the params (the masters), for the copies.
inline std::vector<Tensor> grads_like_params(TensorList params, TensorList grads, TensorList like = {}) {
  std::vector<Tensor> out(grads.begin(), grads.end());
  for (size_t i = 0; i < out.size(); ++i) {
    if (!same_layout(out[i], params[i])) {
      out[i] = core_ops::empty_like(like.empty() ? params[i] : like[i]);
      core_ops::copy_(out[i], grads[i]);
    }
  }
  return out;
}

// Note [Grads written back unscaled]: an op given a grad_scale divides the grads by it
// for the update and, as torch's fused optimizers do, stores the divided grads back
// (without maximize's sign), so after a GradScaler step p.grad holds the grads the
// update used, not `scale` times them. A skipped step (found_inf) writes nothing; a
// scale of exactly 1 writes nothing either (g / 1 == g). The write is the only extra
// traffic: the grads are read anyway.
inline bool writes_grads(const OptionalTensor& grad_scale, double scale) {
  return grad_scale.has_value() && scale != 1.0;
}

// The kernels wrote the copies grads_like_params made (grads laid out unlike their
// params): the grads get those values too.
inline void copy_back_grads(TensorList grads, const std::vector<Tensor>& used) {
  for (size_t i = 0; i < used.size(); ++i) {
    if (!same_tensor(used[i], grads[i])) {
      Tensor grad = grads[i];
      core_ops::copy_(grad, used[i]);
    }
  }
}

// Note [Master grads]: an op declared with master_grads (fused_adam_) also takes
// float32 grads where master_params are given: the masters' own grads, as amp's O2
// keeps them (unscaled, clipped), so that one pass updates the masters and writes the
// half params from them, instead of a second pass copying the masters into the model.
// The update reads the same float32 values either way. CPU kernels only: a CUDA
// kernel refuses them (fused_adam_'s CUDA step says so).

// params / grads as one (device, dtype) group; steps one-element float32 tensors on
// the params' device; found_inf, grad_scale and lr_tensor one-element on that device.
// has_steps=false for optimizers that keep no step count (SGD); master_grads: the op
// takes float32 grads where master_params are given (has_masters; Note [Master grads]).
inline bool check_optimizer_group(TensorList params, TensorList grads,
                                  TensorList steps,
                                  const OptionalTensor& lr_tensor,
                                  const OptionalTensor& grad_scale,
                                  const OptionalTensor& found_inf,
                                  bool has_steps = true, bool master_grads = false, bool has_masters = false) {
  if (!check_matching_lists(params, "params", grads, "grads")) return false;
  const auto device = params[0].device();
  CORE_OPS_CHECK_TYPE(dtype_of(grads[0]) == dtype_of(params[0]) ||
                          (master_grads && has_masters && dtype_of(grads[0]) == ScalarType::Float),
                      "grads have dtype ", dtype_name(dtype_of(grads[0])), " but params have ",
                      dtype_name(dtype_of(params[0])),
                      master_grads ? " (float32 grads are taken with master_params)" : "");
  if (has_steps) check_same_length(params, "params", steps, "steps");
  check_devices(steps, "steps", device);
  for (size_t i = 0; i < steps.size(); ++i) {
    const char* layout = non_strided_layout(steps[i]);
    CORE_OPS_CHECK_TYPE(layout == nullptr, "steps[", i, "] is a ", layout, " tensor; step counts must be dense");
    CORE_OPS_CHECK_VALUE(steps[i].numel() == 1 && dtype_of(steps[i]) == ScalarType::Float,
                         "steps[", i, "] must be a one-element float32 tensor on ", device);
  }
  for (const auto* t : {&lr_tensor, &grad_scale}) {
    if (t->has_value()) {
      CORE_OPS_CHECK_VALUE((*t)->numel() == 1, t == &lr_tensor ? "lr" : "grad_scale",
                           " must be a one-element tensor on ", device);
      check_number(**t, t == &lr_tensor ? "lr" : "grad_scale");
    }
  }
  if (found_inf.has_value()) check_flag(*found_inf);
  // Note [Op boundary] in _boundary.py: where it is on the host (a GPU reads it on the
  // device), and the step is not skipped (a skipped step reads no grads).
  const bool skipped = found_inf.has_value() && found_inf->numel() == 1 && device.type() == DeviceType::CPU &&
                       item(*found_inf) > 0;
  if (grad_scale.has_value() && device.type() == DeviceType::CPU && !skipped) {
    const double s = item(*grad_scale);
    CORE_OPS_CHECK_VALUE(s > 0 && s - s == 0, "grad_scale must be finite and > 0, got ", s);
  }
  return true;
}

// NovoGrad's per-tensor state: exp_avgs_sqs one one-element state-dtype tensor per
// param, grad_norms one norm per param (_validate.check_per_tensor_state's words).
inline void check_per_tensor_state(TensorList params, TensorList exp_avg_sqs, const Tensor& grad_norms) {
  check_same_length(params, "params", exp_avg_sqs, "exp_avg_sqs");
  check_devices(exp_avg_sqs, "exp_avg_sqs", params[0].device());
  for (size_t i = 0; i < exp_avg_sqs.size(); ++i) {
    const char* layout = non_strided_layout(exp_avg_sqs[i]);
    CORE_OPS_CHECK_TYPE(layout == nullptr, "exp_avg_sqs[", i, "] is a ", layout,
                        " tensor; only dense tensors are supported");
  }
  const auto device = params[0].device();
  const auto want = state_dtype(dtype_of(params[0]));
  for (size_t i = 0; i < exp_avg_sqs.size(); ++i) {
    CORE_OPS_CHECK_VALUE(exp_avg_sqs[i].numel() == 1 && exp_avg_sqs[i].device() == device &&
                             dtype_of(exp_avg_sqs[i]) == want,
                         "exp_avg_sqs[", i, "] must be a one-element ", dtype_name(want), " tensor on ", device);
  }
  CORE_OPS_CHECK_VALUE(grad_norms.numel() == static_cast<int64_t>(params.size()) &&
                           grad_norms.device() == device && dtype_of(grad_norms) == want,
                       "grad_norms must hold one ", dtype_name(want), " norm per param on ", device);
}

// LAMB stage 2's per-tensor norms (_validate.check_lamb_norms's words).
inline void check_lamb_norms(TensorList params, const Tensor& param_norms, const Tensor& update_norms) {
  const auto device = params[0].device();
  const auto want = state_dtype(dtype_of(params[0]));
  for (const auto* norms : {&param_norms, &update_norms}) {
    CORE_OPS_CHECK_VALUE(norms->numel() == static_cast<int64_t>(params.size()) && norms->device() == device &&
                             dtype_of(*norms) == want,
                         "param_norms and update_norms must hold one ", dtype_name(want), " norm per param on ",
                         device);
  }
}

}  // namespace core_ops
