// NovoGrad as apex.optimizers.FusedNovoGrad computes it (Apex's multi_tensor_novograd),
// written once for CPU and CUDA (Note [Math written once] in primitives.h). The second
// moment is one scalar per tensor (layer), n its norm of the unscaled grad:
//   norm_type 2: v = beta2*v + (1-beta2)*n^2, n = ||g||_2;  r = sqrt(v)
//   norm_type 0: v = beta2*v + (1-beta2)*n,   n = max|g|;   r = v   (the norm itself)
//   v_1 = n^2 (resp. n) unless init_zero (then the blend starts from v_0 = 0)
//   denom = r / sqrt(bc2) + eps                      (per tensor, in double, rounded once)
//   reg_inside_moment=False (Apex's default, moment_mode 1): the momentum is of the raw
//   grad; the normalisation and the weight decay act on the update term only:
//     m = beta1*m + beta3*g;                  p = p - lr*((m/bc1)/denom + wd*p)
//   reg_inside_moment=True (the paper, Ginsburg et al. 2019; Apex's moment_mode 0):
//     m = beta1*m + beta3*(g/denom + wd*p);   p = p - lr*(m/bc1)
//   bc1 = 1-beta1^t, bc2 = 1-beta2^t (1 without bias correction); beta3 = 1-beta1
//   with grad averaging, else 1.
// The per-tensor part runs on the host (or one thread) before the element loop, so
// every element of a tensor sees the same denom.
#pragma once

#include <cstdint>

#include <core_ops/macros.h>
#include <core_ops/primitives.h>

namespace core_ops {

// v_t from v_{t-1} and the norm of the unscaled grad; `fresh`: the first step without
// init_zero, where v takes the step's value itself (no blend with the zero state).
CORE_OPS_HD double novograd_second_moment(double v, double norm, double beta2, bool fresh,
                                          int64_t norm_type) {
  const double x = norm_type == 0 ? norm : norm * norm;
  return fresh ? x : beta2 * v + (1.0 - beta2) * x;
}

template <typename S>
struct NovoGradCoeffs {
  S denom, beta1, beta3, bc1, neg_lr, weight_decay;
};

// `v` is the stored (rounded) second moment, so a restored state dict gives the same
// denom as the uninterrupted run.
template <typename S>
CORE_OPS_HD NovoGradCoeffs<S> novograd_coeffs(double lr, double beta1, double beta2, double eps,
                                              double weight_decay, double step, double v,
                                              int64_t norm_type, bool bias_correction,
                                              bool grad_averaging) {
  double bc1 = 1.0, bc2 = 1.0;
  if (bias_correction) {
    bc1 = 1.0 - pow(beta1, step);
    bc2 = 1.0 - pow(beta2, step);
  }
  const double layer_norm = norm_type == 0 ? v : sqrt(v);
  return {S(layer_norm / sqrt(bc2) + eps), S(beta1), S(grad_averaging ? 1.0 - beta1 : 1.0),
          S(bc1), S(-lr), S(weight_decay)};
}

// `grad` arrives unscaled and sign-adjusted (maximize) by the caller.
template <bool kRegInside, typename T, typename S>
CORE_OPS_HD void novograd_math(T& param, T grad, T& exp_avg, const NovoGradCoeffs<S>& c) {
  if constexpr (kRegInside) {
    const T g = grad / T(c.denom) + T(c.weight_decay) * param;
    exp_avg = T(c.beta1) * exp_avg + T(c.beta3) * g;
    param = param + T(c.neg_lr) * (exp_avg / T(c.bc1));
  } else {
    exp_avg = T(c.beta1) * exp_avg + T(c.beta3) * grad;
    const T update = exp_avg / T(c.bc1) / T(c.denom) + T(c.weight_decay) * param;
    param = param + T(c.neg_lr) * update;
  }
}

}  // namespace core_ops
