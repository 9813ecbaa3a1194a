// CPU kernel of fused_adam_: the checks are core_ops/optimizer_ops.h, the math
// core_ops/adam_math.h; this file moves memory.
#include <torch/library.h>

#include <core_ops/adam_math.h>

#include "optimizer_step.h"

namespace core_ops::cpu {
namespace {

void adam_step(const AdamArgs& a) {
  if (flag_is_set(a.found_inf)) return;  // a skipped step changes nothing, steps included
  const double lr = value_or(a.lr_tensor, a.lr);
  const GradUnscale unscale(a.grad_scale, a.maximize);
  const std::vector<double> step = advance_steps(a.steps);
  const std::vector<at::Tensor> gs = grads_like_params(a.params, a.grads);
  std::vector<AdamCoeffs<float>> cf(a.params.size());
  std::vector<AdamCoeffs<double>> cd(a.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    cf[i] = adam_coeffs<float>(lr, a.beta1, a.beta2, a.eps, a.weight_decay, step[i], a.bias_correction);
    cd[i] = adam_coeffs<double>(lr, a.beta1, a.beta2, a.eps, a.weight_decay, step[i], a.bias_correction);
  }
  const at::TensorList max_exp_avg_sqs = a.amsgrad ? a.max_exp_avg_sqs : at::TensorList();
  bool_switch(a.adam_w_mode, [&](auto adamw) {
    bool_switch(a.amsgrad, [&](auto ams) {
      // Grads divided by 1 are read as they are (step_chunk's kUnscale): bf16 params
      // leave the loop compute-bound, the division its costliest instruction.
      bool_switch(unscale.div() != 1.0, [&](auto divide) {
        step_params<ams ? 3 : 2, divide>(
            a.params, gs, a.master_params, {a.exp_avgs, a.exp_avg_sqs, max_exp_avg_sqs}, unscale,
            [&](auto tag, auto, int64_t t) {
              const auto& c = for_type<decltype(tag)>(cf, cd)[t];
              return [&](auto& x, auto g, auto& s) {
                if constexpr (decltype(ams)::value) {
                  adam_math<adamw, true>(x, g, s[0], s[1], s[2], c);
                } else {
                  auto unused = g;
                  adam_math<adamw, false>(x, g, s[0], s[1], unused, c);
                }
              };
            });
      });
    });
  });
  if (unscale.write) copy_back_grads(a.grads, gs);
}

}  // namespace

TORCH_LIBRARY_IMPL(core_ops, CPU, m) {
  m.impl("fused_adam_", &fused_adam_<adam_step>);
}

}  // namespace core_ops::cpu
