// CPU kernel of fused_novograd_: the checks are core_ops/optimizer_ops.h, the math
// core_ops/novograd_math.h; the per-tensor grad norms come in (L2 or max|g| as
// norm_type says, taken by core_ops/optimizers/fused_novograd.py).
#include <torch/csrc/stable/library.h>

#include <core_ops/novograd_math.h>

#include "level.h"
#include "optimizer_step.h"

CORE_OPS_CPU_BEGIN
namespace {

template <typename acc_t>
double element_at(const Tensor& t, size_t i) { return data<acc_t>(t)[i]; }

void novograd_step(const NovogradArgs& a) {
  if (flag_is_set(a.found_inf)) return;
  const CpuStep st(a.params, a.grads, a.steps, a.lr, a.lr_tensor, a.grad_scale, a.maximize);
  const bool is_double = dtype_of(a.params[0]) == ScalarType::Double;
  const Tensor norms = core_ops::contiguous(a.grad_norms);
  // The per-tensor second moments, before any element reads its denom.
  std::vector<double> second(a.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    const double norm = (is_double ? element_at<double>(norms, i) : element_at<float>(norms, i)) / st.unscale.scale;
    const bool fresh = st.step[i] == 1.0 && !a.init_zero;
    if (is_double) {
      double* vp = data<double>(a.exp_avg_sqs[i]);
      second[i] = *vp = novograd_second_moment(*vp, norm, a.beta2, fresh, a.norm_type);
    } else {
      float* vp = data<float>(a.exp_avg_sqs[i]);
      second[i] = *vp = static_cast<float>(novograd_second_moment(*vp, norm, a.beta2, fresh, a.norm_type));
    }
  }
  const auto coeffs = coeffs_per_tensor(a.params.size(), [&](auto acc, size_t i) {
    return novograd_coeffs<decltype(acc)>(st.lr, a.beta1, a.beta2, a.eps, a.weight_decay, st.step[i], second[i],
                                          a.norm_type, a.bias_correction, a.grad_averaging);
  });
  bool_switch(a.reg_inside_moment, [&](auto reg_inside) {
    step_params<1>(a.params, st, a.master_params, {a.exp_avgs}, coeffs,
                   [&](auto& x, auto g, auto& s, const auto& c, auto) { novograd_math<reg_inside>(x, g, s[0], c); });
  });
  st.finish(a.grads);
}

}  // namespace
CORE_OPS_CPU_END

CORE_OPS_CPU_OPTIMIZER(fused_novograd_, novograd_step)
