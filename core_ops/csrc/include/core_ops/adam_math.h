// Per-element Adam / AdamW update, written once for the CPU vector loop, the CPU tail
// loop and the CUDA functor (Note [Math written once] in primitives.h).
//
// Note [Adam as torch.optim computes it]: the operations and their order are those of
// torch.optim.Adam's single-tensor path, and every scalar is computed in double and
// rounded once, as torch does with Python floats, so results agree with torch.optim
// to a few ulps:
//   AdamW: p = p * (1 - lr*wd)            L2: g = g + wd*p
//   m = m + (1-beta1) * (g - m)           (lerp with weight < 0.5)
//   v = v*beta2 + ((1-beta2) * g) * g      (addcmul)
//   amsgrad: vmax = max(vmax, v), used in place of v below
//   p = p + (-step_size * m) / (sqrt(v) / bc2_sqrt + eps)    (addcdiv)
//   step_size = lr / (1 - beta1^step), bc2_sqrt = sqrt(1 - beta2^step)
#pragma once

#include <core_ops/macros.h>
#include <core_ops/primitives.h>

namespace core_ops {

// Per-tensor constants: bias corrections depend on each tensor's own step count.
template <typename S>
struct AdamCoeffs {
  S one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, decay;
  S neg_step_size, bc2_sqrt;
};

template <typename S>
CORE_OPS_HD AdamCoeffs<S> adam_coeffs(double lr, double beta1, double beta2, double eps,
                                      double weight_decay, double step, bool bias_correction) {
  double step_size = lr, bc2_sqrt = 1.0;
  if (bias_correction) {
    step_size = lr / (1.0 - pow(beta1, step));
    bc2_sqrt = sqrt(1.0 - pow(beta2, step));
  }
  return {S(1.0 - beta1), S(beta2), S(1.0 - beta2), S(eps), S(weight_decay),
          S(1.0 - lr * weight_decay), S(-step_size), S(bc2_sqrt)};
}

// T is the value type (float, double or a CPU vector), S the scalar type of c.
// `grad` arrives unscaled and sign-adjusted (maximize) by the caller.
template <bool kAdamW, bool kAmsgrad, typename T, typename S>
CORE_OPS_HD void adam_math(T& param, T grad, T& exp_avg, T& exp_avg_sq, T& max_exp_avg_sq,
                           const AdamCoeffs<S>& c) {
  if (kAdamW) {
    param = param * T(c.decay);
  } else {
    grad = grad + T(c.weight_decay) * param;
  }
  exp_avg = exp_avg + T(c.one_minus_beta1) * (grad - exp_avg);
  exp_avg_sq = exp_avg_sq * T(c.beta2) + T(c.one_minus_beta2) * grad * grad;
  T second = exp_avg_sq;
  if (kAmsgrad) {
    max_exp_avg_sq = vmax(max_exp_avg_sq, exp_avg_sq);
    second = max_exp_avg_sq;
  }
  const T denom = vsqrt(second) / T(c.bc2_sqrt) + T(c.eps);
  param = param + T(c.neg_step_size) * exp_avg / denom;
}

}  // namespace core_ops
