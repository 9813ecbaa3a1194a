// CPU kernel of fused_sgd_: the checks are core_ops/optimizer_ops.h, the math
// core_ops/sgd_math.h; this file moves memory.
#include <type_traits>

#include <torch/csrc/stable/library.h>

#include <core_ops/sgd_math.h>

#include "level.h"
#include "optimizer_step.h"

CORE_OPS_CPU_BEGIN
namespace {

void sgd_step(const SgdArgs& a) {
  if (flag_is_set(a.found_inf)) return;
  const CpuStep st(a.params, a.grads, {}, a.lr, a.lr_tensor, a.grad_scale, a.maximize);
  const auto coeffs = coeffs_per_tensor(a.params.size(), [&](auto acc, size_t) {
    return sgd_coeffs<decltype(acc)>(st.lr, a.momentum, a.dampening, a.weight_decay, a.first_step,
                                     a.wd_after_momentum);
  });
  const bool has_momentum = a.momentum != 0.0;
  bool_switch(has_momentum, [&](auto mom) {
    bool_switch(a.nesterov && has_momentum, [&](auto nest) {
      step_params<mom ? 1 : 0>(
          a.params, st, a.master_params, {has_momentum ? a.momentum_buffers : TensorList()}, coeffs,
          [&](auto& x, auto g, auto& s, const auto& c, auto types) {
            using param_t = typename decltype(types)::param_t;
            // Note [Half params without masters]: torch's roundings for a half param alone.
            using Round = std::conditional_t<!decltype(types)::kMaster && !std::is_same_v<param_t, state_t<param_t>>,
                                             RoundTo<param_t>, NoRound>;
            if constexpr (mom) {
              sgd_math<true, nest>(x, g, s[0], c, Round());
            } else {
              auto none = g;  // no momentum buffer: sgd_math leaves it alone
              sgd_math<false, false>(x, g, none, c, Round());
            }
          });
    });
  });
  st.finish(a.grads);
}

}  // namespace
CORE_OPS_CPU_END

CORE_OPS_CPU_OPTIMIZER(fused_sgd_, sgd_step)
