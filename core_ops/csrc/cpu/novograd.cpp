// CPU kernel of fused_novograd_: the checks are core_ops/optimizer_ops.h, the math
// core_ops/novograd_math.h; the per-tensor grad norms come in (L2 or max|g| as
// norm_type says, taken by core_ops/optimizers/fused_novograd.py).
#include <torch/library.h>

#include <core_ops/novograd_math.h>

#include "optimizer_step.h"

namespace core_ops::cpu {
namespace {

template <typename acc_t>
double element_at(const at::Tensor& t, size_t i) { return t.data_ptr<acc_t>()[i]; }

void novograd_step(const NovoGradArgs& a) {
  if (flag_is_set(a.found_inf)) return;
  const double lr = value_or(a.lr_tensor, a.lr);
  const GradUnscale unscale(a.grad_scale, a.maximize);
  const double scale = unscale.scale;
  const std::vector<double> step = advance_steps(a.steps);
  const bool is_double = a.params[0].scalar_type() == at::kDouble;
  const at::Tensor norms = a.grad_norms.contiguous();
  const std::vector<at::Tensor> gs = grads_like_params(a.params, a.grads);
  // The per-tensor second moments, before any element reads its denom.
  std::vector<NovoGradCoeffs<float>> cf(a.params.size());
  std::vector<NovoGradCoeffs<double>> cd(a.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    const double norm = (is_double ? element_at<double>(norms, i) : element_at<float>(norms, i)) / scale;
    const bool fresh = step[i] == 1.0 && !a.init_zero;
    double v;
    if (is_double) {
      double* vp = a.exp_avg_sqs[i].data_ptr<double>();
      v = *vp = novograd_second_moment(*vp, norm, a.beta2, fresh, a.norm_type);
    } else {
      float* vp = a.exp_avg_sqs[i].data_ptr<float>();
      v = *vp = static_cast<float>(novograd_second_moment(*vp, norm, a.beta2, fresh, a.norm_type));
    }
    cf[i] = novograd_coeffs<float>(lr, a.beta1, a.beta2, a.eps, a.weight_decay, step[i], v,
                                   a.norm_type, a.bias_correction, a.grad_averaging);
    cd[i] = novograd_coeffs<double>(lr, a.beta1, a.beta2, a.eps, a.weight_decay, step[i], v,
                                    a.norm_type, a.bias_correction, a.grad_averaging);
  }
  bool_switch(a.reg_inside_moment, [&](auto reg_inside) {
    step_params<1>(a.params, gs, a.master_params, {a.exp_avgs}, unscale, [&](auto tag, auto, int64_t t) {
      const auto& c = for_type<decltype(tag)>(cf, cd)[t];
      return [&](auto& x, auto g, auto& s) { novograd_math<reg_inside>(x, g, s[0], c); };
    });
  });
  if (unscale.write) copy_back_grads(a.grads, gs);
}

}  // namespace

TORCH_LIBRARY_IMPL(core_ops, CPU, m) {
  m.impl("fused_novograd_", &fused_novograd_<novograd_step>);
}

}  // namespace core_ops::cpu
