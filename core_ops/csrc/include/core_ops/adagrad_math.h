// Per-element Adagrad, written once for CPU and CUDA (Note [Math written once] in
// primitives.h). The operations follow torch.optim.Adagrad:
//   g = g + wd*p                          (L2; adagrad_w_mode decouples it, as Apex)
//   sum = sum + g*g
//   p = p + (-clr * g) / (sqrt(sum) + eps),  clr = lr / (1 + (step-1)*lr_decay)
//   adagrad_w_mode: p = p + (-clr) * (g / (sqrt(sum) + eps) + wd*p)
#pragma once

#include <core_ops/macros.h>
#include <core_ops/primitives.h>

namespace core_ops {

template <typename S>
struct AdagradCoeffs {
  S neg_clr, eps, weight_decay;
};

template <typename S>
CORE_OPS_HD AdagradCoeffs<S> adagrad_coeffs(double lr, double lr_decay, double eps,
                                            double weight_decay, double step) {
  return {S(-(lr / (1.0 + (step - 1.0) * lr_decay))), S(eps), S(weight_decay)};
}

template <bool kWMode, typename T, typename S>
CORE_OPS_HD void adagrad_math(T& param, T grad, T& sum, const AdagradCoeffs<S>& c) {
  if (!kWMode) grad = grad + T(c.weight_decay) * param;
  sum = sum + grad * grad;
  const T std = vsqrt(sum) + T(c.eps);
  if (kWMode) {
    param = param + T(c.neg_clr) * (grad / std + T(c.weight_decay) * param);
  } else {
    param = param + T(c.neg_clr) * grad / std;
  }
}

}  // namespace core_ops
