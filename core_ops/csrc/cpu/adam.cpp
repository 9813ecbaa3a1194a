// CPU kernel of fused_adam_: the checks are core_ops/optimizer_ops.h, the math
// core_ops/adam_math.h; this file moves memory.
#include <torch/csrc/stable/library.h>

#include <core_ops/adam_math.h>

#include "level.h"
#include "optimizer_step.h"

CORE_OPS_CPU_BEGIN
namespace {

void adam_step(const AdamArgs& a) {
  if (flag_is_set(a.found_inf)) return;  // a skipped step changes nothing, steps included
  // float32 grads of half params: the masters' (Note [Master grads]), in their layout.
  const bool master_grads = dtype_of(a.grads[0]) != dtype_of(a.params[0]);
  const CpuStep st(a.params, a.grads, a.steps, a.lr, a.lr_tensor, a.grad_scale, a.maximize,
                   master_grads ? a.master_params : TensorList());
  const auto coeffs = coeffs_per_tensor(a.params.size(), [&](auto acc, size_t i) {
    return adam_coeffs<decltype(acc)>(st.lr, a.beta1, a.beta2, a.eps, a.weight_decay, st.step[i], a.bias_correction);
  });
  const TensorList max_exp_avg_sqs = a.amsgrad ? a.max_exp_avg_sqs : TensorList();
  bool_switch(a.adam_w_mode, [&](auto adamw) {
    bool_switch(a.amsgrad, [&](auto ams) {
      // Grads divided by 1 are read as they are (step_chunk's kUnscale): bf16 params
      // leave the loop compute-bound, the division its costliest instruction.
      bool_switch(st.unscale.div() != 1.0, [&](auto divide) {
        bool_switch(master_grads, [&](auto float_grads) {
          step_params<ams ? 3 : 2, divide, float_grads>(
              a.params, st, a.master_params, {a.exp_avgs, a.exp_avg_sqs, max_exp_avg_sqs}, coeffs,
              [&](auto& x, auto g, auto& s, const auto& c, auto) {
                if constexpr (decltype(ams)::value) {
                  adam_math<adamw, true>(x, g, s[0], s[1], s[2], c);
                } else {
                  auto unused = g;
                  adam_math<adamw, false>(x, g, s[0], s[1], unused, c);
                }
              });
        });
      });
    });
  });
  st.finish(a.grads);
}

}  // namespace
CORE_OPS_CPU_END

CORE_OPS_CPU_OPTIMIZER(fused_adam_, adam_step)
