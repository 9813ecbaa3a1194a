// Per-element SGD with momentum, written once for CPU and CUDA (Note [Math written
// once] in primitives.h). The operations follow torch.optim.SGD:
//   d = g + wd*p                          (unless wd_after_momentum, Apex's option)
//   momentum: buf = first ? d : buf*momentum + (1-dampening)*d
//             d = nesterov ? d + momentum*buf : buf
//   wd_after_momentum: d = d + wd*p
//   p = p + (-lr)*d
#pragma once

#include <core_ops/macros.h>
#include <core_ops/primitives.h>

namespace core_ops {

template <typename S>
struct SgdCoeffs {
  S neg_lr, momentum, one_minus_dampening, weight_decay;
  bool first_step, wd_after_momentum;
};

template <typename S>
CORE_OPS_HD SgdCoeffs<S> sgd_coeffs(double lr, double momentum, double dampening,
                                    double weight_decay, bool first_step,
                                    bool wd_after_momentum) {
  return {S(-lr), S(momentum), S(1.0 - dampening), S(weight_decay), first_step,
          wd_after_momentum};
}

// `round` rounds each op's result as torch.optim does for a half param stepped
// without masters (Note [Half params without masters] in primitives.h): the grad as
// the param's dtype holds it, d after weight decay, the buffer after its multiply and
// after its add, d after Nesterov's add; param's own rounding is its store.
template <bool kMomentum, bool kNesterov, typename T, typename S, typename R = NoRound>
CORE_OPS_HD void sgd_math(T& param, T grad, T& buf, const SgdCoeffs<S>& c, const R& round = R()) {
  T d = round(grad);
  if (!c.wd_after_momentum) d = round(d + T(c.weight_decay) * param);
  if (kMomentum) {
    buf = c.first_step ? d : round(round(buf * T(c.momentum)) + T(c.one_minus_dampening) * d);
    d = kNesterov ? round(d + T(c.momentum) * buf) : buf;
  }
  if (c.wd_after_momentum) d = round(d + T(c.weight_decay) * param);
  param = param + T(c.neg_lr) * d;
}

}  // namespace core_ops
