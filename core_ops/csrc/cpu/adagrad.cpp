// CPU kernel of fused_adagrad_: the checks are core_ops/optimizer_ops.h, the math
// core_ops/adagrad_math.h.
#include <torch/csrc/stable/library.h>

#include <core_ops/adagrad_math.h>

#include "level.h"
#include "optimizer_step.h"

CORE_OPS_CPU_BEGIN
namespace {

void adagrad_step(const AdagradArgs& a) {
  if (flag_is_set(a.found_inf)) return;
  const CpuStep st(a.params, a.grads, a.steps, a.lr, a.lr_tensor, a.grad_scale, a.maximize);
  const auto coeffs = coeffs_per_tensor(a.params.size(), [&](auto acc, size_t i) {
    return adagrad_coeffs<decltype(acc)>(st.lr, a.lr_decay, a.eps, a.weight_decay, st.step[i]);
  });
  bool_switch(a.adagrad_w_mode, [&](auto wmode) {
    step_params<1>(a.params, st, a.master_params, {a.state_sums}, coeffs,
                   [&](auto& x, auto g, auto& s, const auto& c, auto) { adagrad_math<wmode>(x, g, s[0], c); });
  });
  st.finish(a.grads);
}

}  // namespace
CORE_OPS_CPU_END

CORE_OPS_CPU_OPTIMIZER(fused_adagrad_, adagrad_step)
