// Each fused optimizer op's C++ entry point, written once for its CPU and CUDA kernels:
// the schema's signature (core_ops/_schemas.py), every argument check, and the
// arguments bundled into one struct for the device's step function. A kernel file
// writes only that step and registers `&fused_adam_<adam_step>`; so the two devices
// accept and refuse exactly the same calls, with the same words.
//
// The structs hold references: they live for one call, inside the entry point.
#pragma once

#include <optional>

#include <core_ops/compact_state_args.h>
#include <core_ops/optimizer_args.h>
#include <core_ops/tensor.h>

namespace core_ops {

// ---- fused_adam_ ------------------------------------------------------------------

struct AdamArgs {
  TensorList params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, master_params, steps;
  double lr, beta1, beta2, eps, weight_decay;
  bool adam_w_mode, bias_correction, amsgrad, maximize;
  const OptionalTensor &lr_tensor, &grad_scale, &found_inf;
};

template <void (*kStep)(const AdamArgs&)>
void fused_adam_(TensorList params, TensorList grads, TensorList exp_avgs,
                 TensorList exp_avg_sqs, TensorList max_exp_avg_sqs,
                 TensorList master_params, TensorList steps, double lr, double beta1,
                 double beta2, double eps, double weight_decay, bool adam_w_mode,
                 bool bias_correction, bool amsgrad, bool maximize, const OptionalTensor& lr_tensor,
                 const OptionalTensor& grad_scale, const OptionalTensor& found_inf) {
  CallDevice().list(params, "params").list(grads, "grads").list(exp_avgs, "exp_avgs")
      .list(exp_avg_sqs, "exp_avg_sqs").list(max_exp_avg_sqs, "max_exp_avg_sqs")
      .list(master_params, "master_params").list(steps, "steps").one(lr_tensor, "lr_tensor")
      .one(grad_scale, "grad_scale").one(found_inf, "found_inf");
  Operands(7 * params.size() + 3)
      .writes(params, "params").writes(grads, "grads").writes(exp_avgs, "exp_avgs").writes(exp_avg_sqs, "exp_avg_sqs")
      .writes(max_exp_avg_sqs, "max_exp_avg_sqs").writes(master_params, "master_params").writes(steps, "steps")
      .reads(lr_tensor, "lr_tensor").reads(grad_scale, "grad_scale").reads(found_inf, "found_inf").check();
  if (!check_optimizer_group(params, grads, steps, lr_tensor, grad_scale, found_inf)) return;
  check_state_list(params, exp_avgs, "exp_avgs", false);
  check_state_list(params, exp_avg_sqs, "exp_avg_sqs", false);
  check_state_list(params, max_exp_avg_sqs, "max_exp_avg_sqs", !amsgrad);
  CORE_OPS_CHECK_VALUE(!amsgrad || !max_exp_avg_sqs.empty(), "amsgrad needs max_exp_avg_sqs");
  check_masters(params, master_params);
  check_layouts(params, {{exp_avgs, "exp_avgs"}, {exp_avg_sqs, "exp_avg_sqs"},
                         {max_exp_avg_sqs, "max_exp_avg_sqs"}, {master_params, "master_params"}});
  kStep({params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, master_params, steps, lr, beta1, beta2,
         eps, weight_decay, adam_w_mode, bias_correction, amsgrad, maximize, lr_tensor, grad_scale,
         found_inf});
}

// ---- fused_adam_compact_ ----------------------------------------------------------

struct AdamCompactArgs {
  TensorList params, grads, exp_avgs, exp_avg_sqs, exp_avg_absmaxes, exp_avg_sq_absmaxes,
      master_params, steps;
  const OptionalTensor &exp_avg_map, &exp_avg_sq_map;
  double lr, beta1, beta2, eps, weight_decay;
  bool adam_w_mode, bias_correction, maximize;
  const OptionalTensor &lr_tensor, &grad_scale, &found_inf;
  CompactLayout layout;  // what the checks found
};

template <void (*kStep)(const AdamCompactArgs&)>
void fused_adam_compact_(TensorList params, TensorList grads, TensorList exp_avgs,
                         TensorList exp_avg_sqs, TensorList exp_avg_absmaxes,
                         TensorList exp_avg_sq_absmaxes, TensorList master_params,
                         TensorList steps, const OptionalTensor& exp_avg_map,
                         const OptionalTensor& exp_avg_sq_map, double lr, double beta1, double beta2,
                         double eps, double weight_decay, bool adam_w_mode, bool bias_correction,
                         bool maximize, const OptionalTensor& lr_tensor, const OptionalTensor& grad_scale,
                         const OptionalTensor& found_inf) {
  CallDevice().list(params, "params").list(grads, "grads").list(exp_avgs, "exp_avgs")
      .list(exp_avg_sqs, "exp_avg_sqs").list(exp_avg_absmaxes, "exp_avg_absmaxes")
      .list(exp_avg_sq_absmaxes, "exp_avg_sq_absmaxes").list(master_params, "master_params")
      .list(steps, "steps").one(exp_avg_map, "exp_avg_map").one(exp_avg_sq_map, "exp_avg_sq_map")
      .one(lr_tensor, "lr_tensor").one(grad_scale, "grad_scale").one(found_inf, "found_inf");
  Operands(8 * params.size() + 5)
      .writes(params, "params").writes(grads, "grads").writes(exp_avgs, "exp_avgs").writes(exp_avg_sqs, "exp_avg_sqs")
      .writes(exp_avg_absmaxes, "exp_avg_absmaxes").writes(exp_avg_sq_absmaxes, "exp_avg_sq_absmaxes")
      .writes(master_params, "master_params").writes(steps, "steps").reads(exp_avg_map, "exp_avg_map")
      .reads(exp_avg_sq_map, "exp_avg_sq_map").reads(lr_tensor, "lr_tensor").reads(grad_scale, "grad_scale")
      .reads(found_inf, "found_inf").check();
  const auto layout = check_compact_adam(params, grads, exp_avgs, exp_avg_sqs, exp_avg_absmaxes,
                                         exp_avg_sq_absmaxes, master_params, steps, exp_avg_map,
                                         exp_avg_sq_map, lr_tensor, grad_scale, found_inf);
  if (!layout.has_value()) return;
  kStep({params, grads, exp_avgs, exp_avg_sqs, exp_avg_absmaxes, exp_avg_sq_absmaxes, master_params,
         steps, exp_avg_map, exp_avg_sq_map, lr, beta1, beta2, eps, weight_decay, adam_w_mode,
         bias_correction, maximize, lr_tensor, grad_scale, found_inf, *layout});
}

// ---- fused_sgd_ -------------------------------------------------------------------

struct SgdArgs {
  TensorList params, grads, momentum_buffers, master_params;
  double lr, momentum, dampening, weight_decay;
  bool nesterov, wd_after_momentum, first_step, maximize;
  const OptionalTensor &lr_tensor, &grad_scale, &found_inf;

  bool has_momentum() const { return momentum != 0.0; }
};

template <void (*kStep)(const SgdArgs&)>
void fused_sgd_(TensorList params, TensorList grads, TensorList momentum_buffers,
                TensorList master_params, double lr, double momentum, double dampening,
                double weight_decay, bool nesterov, bool wd_after_momentum, bool first_step,
                bool maximize, const OptionalTensor& lr_tensor, const OptionalTensor& grad_scale,
                const OptionalTensor& found_inf) {
  CallDevice().list(params, "params").list(grads, "grads").list(momentum_buffers, "momentum_buffers")
      .list(master_params, "master_params").one(lr_tensor, "lr_tensor").one(grad_scale, "grad_scale")
      .one(found_inf, "found_inf");
  Operands(4 * params.size() + 3)
      .writes(params, "params").writes(grads, "grads").writes(momentum_buffers, "momentum_buffers")
      .writes(master_params, "master_params").reads(lr_tensor, "lr_tensor").reads(grad_scale, "grad_scale")
      .reads(found_inf, "found_inf").check();
  if (!check_optimizer_group(params, grads, {}, lr_tensor, grad_scale, found_inf, /*has_steps=*/false)) {
    return;
  }
  const bool has_momentum = momentum != 0.0;
  check_state_list(params, momentum_buffers, "momentum_buffers", !has_momentum);
  CORE_OPS_CHECK_VALUE(!has_momentum || !momentum_buffers.empty(), "momentum needs momentum_buffers");
  CORE_OPS_CHECK_VALUE(!nesterov || has_momentum, "nesterov needs momentum > 0");
  check_masters(params, master_params);
  check_layouts(params, {{momentum_buffers, "momentum_buffers"}, {master_params, "master_params"}});
  kStep({params, grads, momentum_buffers, master_params, lr, momentum, dampening, weight_decay, nesterov,
         wd_after_momentum, first_step, maximize, lr_tensor, grad_scale, found_inf});
}

// ---- fused_adagrad_ ---------------------------------------------------------------

struct AdagradArgs {
  TensorList params, grads, state_sums, master_params, steps;
  double lr, lr_decay, eps, weight_decay;
  bool adagrad_w_mode, maximize;
  const OptionalTensor &lr_tensor, &grad_scale, &found_inf;
};

template <void (*kStep)(const AdagradArgs&)>
void fused_adagrad_(TensorList params, TensorList grads, TensorList state_sums,
                    TensorList master_params, TensorList steps, double lr, double lr_decay,
                    double eps, double weight_decay, bool adagrad_w_mode, bool maximize,
                    const OptionalTensor& lr_tensor, const OptionalTensor& grad_scale,
                    const OptionalTensor& found_inf) {
  CallDevice().list(params, "params").list(grads, "grads").list(state_sums, "state_sums")
      .list(master_params, "master_params").list(steps, "steps").one(lr_tensor, "lr_tensor")
      .one(grad_scale, "grad_scale").one(found_inf, "found_inf");
  Operands(5 * params.size() + 3)
      .writes(params, "params").writes(grads, "grads").writes(state_sums, "state_sums")
      .writes(master_params, "master_params").writes(steps, "steps").reads(lr_tensor, "lr_tensor")
      .reads(grad_scale, "grad_scale").reads(found_inf, "found_inf").check();
  if (!check_optimizer_group(params, grads, steps, lr_tensor, grad_scale, found_inf)) return;
  check_state_list(params, state_sums, "state_sums", false);
  check_masters(params, master_params);
  check_layouts(params, {{state_sums, "state_sums"}, {master_params, "master_params"}});
  kStep({params, grads, state_sums, master_params, steps, lr, lr_decay, eps, weight_decay, adagrad_w_mode,
         maximize, lr_tensor, grad_scale, found_inf});
}

// ---- fused_novograd_ --------------------------------------------------------------

struct NovoGradArgs {
  TensorList params, grads, exp_avgs, exp_avg_sqs, master_params, steps;
  const Tensor& grad_norms;
  int64_t norm_type;
  double lr, beta1, beta2, eps, weight_decay;
  bool bias_correction, reg_inside_moment, grad_averaging, init_zero, maximize;
  const OptionalTensor &lr_tensor, &grad_scale, &found_inf;
};

// exp_avg_sqs: one one-element state-dtype tensor per param; grad_norms: one norm per param.
inline void check_novograd_per_tensor_state(TensorList params, TensorList exp_avg_sqs,
                                            const Tensor& grad_norms) {
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

template <void (*kStep)(const NovoGradArgs&)>
void fused_novograd_(TensorList params, TensorList grads, TensorList exp_avgs,
                     TensorList exp_avg_sqs, TensorList master_params, TensorList steps,
                     const Tensor& grad_norms, int64_t norm_type, double lr, double beta1,
                     double beta2, double eps, double weight_decay, bool bias_correction,
                     bool reg_inside_moment, bool grad_averaging, bool init_zero, bool maximize,
                     const OptionalTensor& lr_tensor, const OptionalTensor& grad_scale,
                     const OptionalTensor& found_inf) {
  CallDevice().list(params, "params").list(grads, "grads").list(exp_avgs, "exp_avgs")
      .list(exp_avg_sqs, "exp_avg_sqs").list(master_params, "master_params").list(steps, "steps")
      .one(grad_norms, "grad_norms").one(lr_tensor, "lr_tensor").one(grad_scale, "grad_scale")
      .one(found_inf, "found_inf");
  Operands(6 * params.size() + 4)
      .writes(params, "params").writes(grads, "grads").writes(exp_avgs, "exp_avgs").writes(exp_avg_sqs, "exp_avg_sqs")
      .writes(master_params, "master_params").writes(steps, "steps").reads(grad_norms, "grad_norms")
      .reads(lr_tensor, "lr_tensor").reads(grad_scale, "grad_scale").reads(found_inf, "found_inf").check();
  // A scalar argument, checked even for an empty call (the reference does).
  CORE_OPS_CHECK_VALUE(norm_type == 0 || norm_type == 2,
                       "norm_type must be 2 (L2) or 0 (infinity norm), got ", norm_type);
  if (!check_optimizer_group(params, grads, steps, lr_tensor, grad_scale, found_inf)) return;
  check_state_list(params, exp_avgs, "exp_avgs", false);
  check_novograd_per_tensor_state(params, exp_avg_sqs, grad_norms);
  check_masters(params, master_params);
  check_layouts(params, {{exp_avgs, "exp_avgs"}, {master_params, "master_params"}});
  kStep({params, grads, exp_avgs, exp_avg_sqs, master_params, steps, grad_norms, norm_type, lr, beta1,
         beta2, eps, weight_decay, bias_correction, reg_inside_moment, grad_averaging, init_zero, maximize,
         lr_tensor, grad_scale, found_inf});
}

// ---- fused_lamb_stage1_ and fused_lamb_stage2_ -------------------------------------

struct LambStage1Args {
  TensorList params, grads, exp_avgs, exp_avg_sqs, master_params, steps, updates;
  double beta1, beta2, eps, weight_decay;
  bool adam_w_mode, bias_correction, grad_averaging, maximize;
  const OptionalTensor &grad_scale, &found_inf;
};

template <void (*kStep)(const LambStage1Args&)>
void fused_lamb_stage1_(TensorList params, TensorList grads, TensorList exp_avgs,
                        TensorList exp_avg_sqs, TensorList master_params, TensorList steps,
                        TensorList updates, double beta1, double beta2, double eps,
                        double weight_decay, bool adam_w_mode, bool bias_correction,
                        bool grad_averaging, bool maximize, const OptionalTensor& grad_scale,
                        const OptionalTensor& found_inf) {
  CallDevice().list(params, "params").list(grads, "grads").list(exp_avgs, "exp_avgs")
      .list(exp_avg_sqs, "exp_avg_sqs").list(master_params, "master_params").list(steps, "steps")
      .list(updates, "updates").one(grad_scale, "grad_scale").one(found_inf, "found_inf");
  Operands(7 * params.size() + 2)
      .reads(params, "params").writes(grads, "grads").writes(exp_avgs, "exp_avgs")
      .writes(exp_avg_sqs, "exp_avg_sqs").reads(master_params, "master_params").writes(steps, "steps")
      .writes(updates, "updates").reads(grad_scale, "grad_scale").reads(found_inf, "found_inf").check();
  if (!check_optimizer_group(params, grads, steps, std::nullopt, grad_scale, found_inf)) return;
  check_state_list(params, exp_avgs, "exp_avgs", false);
  check_state_list(params, exp_avg_sqs, "exp_avg_sqs", false);
  check_state_list(params, updates, "updates", false);
  check_masters(params, master_params);
  check_layouts(params, {{exp_avgs, "exp_avgs"}, {exp_avg_sqs, "exp_avg_sqs"},
                         {updates, "updates"}, {master_params, "master_params"}});
  kStep({params, grads, exp_avgs, exp_avg_sqs, master_params, steps, updates, beta1, beta2, eps,
         weight_decay, adam_w_mode, bias_correction, grad_averaging, maximize, grad_scale, found_inf});
}

struct LambStage2Args {
  TensorList params, master_params, updates;
  const Tensor &param_norms, &update_norms;
  double lr, weight_decay;
  bool use_nvlamb;
  const OptionalTensor &lr_tensor, &found_inf;
};

template <void (*kStep)(const LambStage2Args&)>
void fused_lamb_stage2_(TensorList params, TensorList master_params, TensorList updates,
                        const Tensor& param_norms, const Tensor& update_norms, double lr,
                        double weight_decay, bool use_nvlamb, const OptionalTensor& lr_tensor,
                        const OptionalTensor& found_inf) {
  CallDevice().list(params, "params").list(master_params, "master_params").list(updates, "updates")
      .one(param_norms, "param_norms").one(update_norms, "update_norms").one(lr_tensor, "lr_tensor")
      .one(found_inf, "found_inf");
  Operands(3 * params.size() + 4)
      .writes(params, "params").writes(master_params, "master_params").reads(updates, "updates")
      .reads(param_norms, "param_norms").reads(update_norms, "update_norms").reads(lr_tensor, "lr_tensor")
      .reads(found_inf, "found_inf").check();
  if (params.empty()) return;
  const auto device = params[0].device();
  check_list(params, "params", device);
  check_state_list(params, updates, "updates", false);
  check_masters(params, master_params);
  check_layouts(params, {{updates, "updates"}, {master_params, "master_params"}});
  const auto want = state_dtype(dtype_of(params[0]));
  for (const auto* norms : {&param_norms, &update_norms}) {
    CORE_OPS_CHECK_VALUE(norms->numel() == static_cast<int64_t>(params.size()) && norms->device() == device &&
                             dtype_of(*norms) == want,
                         "param_norms and update_norms must hold one ", dtype_name(want), " norm per param on ",
                         device);
  }
  if (found_inf.has_value()) check_flag(*found_inf);
  if (lr_tensor.has_value()) {
    CORE_OPS_CHECK_VALUE(lr_tensor->numel() == 1, "lr must be a one-element tensor on ", device);
    check_number(*lr_tensor, "lr");
  }
  kStep({params, master_params, updates, param_norms, update_norms, lr, weight_decay, use_nvlamb, lr_tensor,
         found_inf});
}

}  // namespace core_ops
