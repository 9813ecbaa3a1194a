// Per-element LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning",
// with Apex's options), written once for CPU and CUDA (Note [Math written once] in
// primitives.h). Two stages around the per-tensor norms:
//   stage 1 (grads already unscaled and clipped by the global norm):
//     L2 mode: g = g + wd*p
//     m = beta1*m + beta3*g,  beta3 = 1-beta1 with grad_averaging, else 1
//     v = beta2*v + (1-beta2)*g*g
//     u = (m / bc1) / (sqrt(v / bc2) + eps);  decoupled (adam_w_mode): u = u + wd*p
//   stage 2, with the trust ratio r = ||p|| / ||u|| (1 when either norm is 0, or
//   when wd == 0 and not use_nvlamb):  p = p - lr*r*u
#pragma once

#include <core_ops/macros.h>
#include <core_ops/primitives.h>

namespace core_ops {

template <typename S>
struct LambCoeffs {
  S beta1, beta3, beta2, one_minus_beta2, bc1, bc2, eps, weight_decay;
};

template <typename S>
CORE_OPS_HD LambCoeffs<S> lamb_coeffs(double beta1, double beta2, double eps,
                                      double weight_decay, double step, bool bias_correction,
                                      bool grad_averaging) {
  const double bc1 = bias_correction ? 1.0 - pow(beta1, step) : 1.0;
  const double bc2 = bias_correction ? 1.0 - pow(beta2, step) : 1.0;
  return {S(beta1), S(grad_averaging ? 1.0 - beta1 : 1.0), S(beta2), S(1.0 - beta2),
          S(bc1), S(bc2), S(eps), S(weight_decay)};
}

template <bool kAdamW, typename T, typename S>
CORE_OPS_HD T lamb_stage1_math(T param, T grad, T& exp_avg, T& exp_avg_sq,
                               const LambCoeffs<S>& c) {
  if (!kAdamW) grad = grad + T(c.weight_decay) * param;
  exp_avg = exp_avg * T(c.beta1) + T(c.beta3) * grad;
  exp_avg_sq = exp_avg_sq * T(c.beta2) + T(c.one_minus_beta2) * grad * grad;
  T update = (exp_avg / T(c.bc1)) / (vsqrt(exp_avg_sq / T(c.bc2)) + T(c.eps));
  if (kAdamW) update = update + T(c.weight_decay) * param;
  return update;
}

// The step size of stage 2 for one tensor: -lr times its trust ratio.
template <typename S>
CORE_OPS_HD S lamb_neg_step(double lr, S param_norm, S update_norm, double weight_decay,
                            bool use_nvlamb) {
  S ratio = S(1);
  if ((use_nvlamb || weight_decay != 0.0) && param_norm > S(0) && update_norm > S(0)) {
    ratio = param_norm / update_norm;
  }
  return S(-lr) * ratio;
}

template <typename T, typename S>
CORE_OPS_HD void lamb_stage2_math(T& param, T update, S neg_step) {
  param = param + T(neg_step) * update;
}

}  // namespace core_ops
