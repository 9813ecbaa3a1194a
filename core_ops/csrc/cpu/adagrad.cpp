// CPU kernel of fused_adagrad_: the checks are core_ops/optimizer_ops.h, the math
// core_ops/adagrad_math.h.
#include <torch/library.h>

#include <core_ops/adagrad_math.h>

#include "optimizer_step.h"

namespace core_ops::cpu {
namespace {

void adagrad_step(const AdagradArgs& a) {
  if (flag_is_set(a.found_inf)) return;
  const double lr = value_or(a.lr_tensor, a.lr);
  const GradUnscale unscale(a.grad_scale, a.maximize);
  const std::vector<double> step = advance_steps(a.steps);
  const std::vector<at::Tensor> gs = grads_like_params(a.params, a.grads);
  std::vector<AdagradCoeffs<float>> cf(a.params.size());
  std::vector<AdagradCoeffs<double>> cd(a.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    cf[i] = adagrad_coeffs<float>(lr, a.lr_decay, a.eps, a.weight_decay, step[i]);
    cd[i] = adagrad_coeffs<double>(lr, a.lr_decay, a.eps, a.weight_decay, step[i]);
  }
  bool_switch(a.adagrad_w_mode, [&](auto wmode) {
    step_params<1>(a.params, gs, a.master_params, {a.state_sums}, unscale, [&](auto tag, auto, int64_t t) {
      const auto& c = for_type<decltype(tag)>(cf, cd)[t];
      return [&](auto& x, auto g, auto& s) { adagrad_math<wmode>(x, g, s[0], c); };
    });
  });
  if (unscale.write) copy_back_grads(a.grads, gs);
}

}  // namespace

TORCH_LIBRARY_IMPL(core_ops, CPU, m) {
  m.impl("fused_adagrad_", &fused_adagrad_<adagrad_step>);
}

}  // namespace core_ops::cpu
