// CPU kernel of fused_novograd_: the math is core_ops/novograd_math.h; the per-tensor
// grad norms come in (L2 or max|g| as norm_type says, taken by
// core_ops/optimizers/fused_novograd.py).
#include <torch/library.h>

#include <core_ops/novograd_math.h>

#include "optimizer_step.h"

namespace core_ops::cpu {
namespace {

template <bool kRegInside, bool kMaster, typename param_t>
void novograd_chunk(void* param, void* grad, void* exp_avg, void* master, int64_t begin,
                    int64_t end, const NovoGradCoeffs<state_t<param_t>>& c,
                    const GradUnscale& unscale) {
  using acc_t = state_t<param_t>;
  auto* p = static_cast<param_t*>(param);
  auto* g = static_cast<param_t*>(grad);
  auto* m = static_cast<acc_t*>(exp_avg);
  auto* w = static_cast<acc_t*>(master);
  const GradReader<acc_t> grads(unscale);
  int64_t i = begin;
  if constexpr (!std::is_same_v<param_t, double>) {
    for (; i + kWidth <= end; i += kWidth) {
      fVec p0, p1, g0, g1, m0, m1;
      if constexpr (kMaster) load2(w + i, p0, p1); else load2(p + i, p0, p1);
      grads.load(g + i, g0, g1);
      load2(m + i, m0, m1);
      novograd_math<kRegInside>(p0, g0, m0, c);
      novograd_math<kRegInside>(p1, g1, m1, c);
      store2(m + i, m0, m1);
      if constexpr (kMaster) store2(w + i, p0, p1);
      store2(p + i, p0, p1);
    }
  }
  for (; i < end; ++i) {
    acc_t pv = kMaster ? w[i] : static_cast<acc_t>(p[i]);
    novograd_math<kRegInside>(pv, grads.load(g + i), m[i], c);
    if constexpr (kMaster) w[i] = pv;
    p[i] = static_cast<param_t>(pv);
  }
}

// exp_avg_sqs: one one-element state-dtype tensor per param; grad_norms: one norm per param.
void check_per_tensor_state(at::TensorList params, at::TensorList exp_avg_sqs,
                            const at::Tensor& grad_norms) {
  check_same_length(params, "params", exp_avg_sqs, "exp_avg_sqs");
  const auto device = params[0].device();
  const auto want = state_dtype(params[0].scalar_type());
  for (size_t i = 0; i < exp_avg_sqs.size(); ++i) {
    TORCH_CHECK_VALUE(exp_avg_sqs[i].numel() == 1 && exp_avg_sqs[i].device() == device &&
                          exp_avg_sqs[i].scalar_type() == want,
                      "exp_avg_sqs[", i, "] must be a one-element ", dtype_name(want),
                      " tensor on ", device);
  }
  TORCH_CHECK_VALUE(grad_norms.numel() == static_cast<int64_t>(params.size()) &&
                        grad_norms.device() == device && grad_norms.scalar_type() == want,
                    "grad_norms must hold one ", dtype_name(want), " norm per param on ", device);
}

template <typename acc_t>
double element_at(const at::Tensor& t, size_t i) { return t.data_ptr<acc_t>()[i]; }

void fused_novograd_(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                     at::TensorList exp_avg_sqs, at::TensorList master_params,
                     at::TensorList steps, const at::Tensor& grad_norms, int64_t norm_type,
                     double lr, double beta1, double beta2, double eps, double weight_decay,
                     bool bias_correction, bool reg_inside_moment, bool grad_averaging,
                     bool init_zero, bool maximize,
                     const std::optional<at::Tensor>& lr_tensor,
                     const std::optional<at::Tensor>& grad_scale,
                     const std::optional<at::Tensor>& found_inf) {
  if (!check_optimizer_group(params, grads, steps, lr_tensor, grad_scale, found_inf)) return;
  check_state_list(params, exp_avgs, "exp_avgs", false);
  check_per_tensor_state(params, exp_avg_sqs, grad_norms);
  check_masters(params, master_params);
  check_layouts(params, {{exp_avgs, "exp_avgs"}, {master_params, "master_params"}});
  TORCH_CHECK_VALUE(norm_type == 0 || norm_type == 2,
                    "norm_type must be 2 (L2) or 0 (infinity norm), got ", norm_type);
  if (flag_is_set(found_inf)) return;

  lr = value_or(lr_tensor, lr);
  const GradUnscale unscale(grad_scale, maximize);
  const double scale = unscale.scale;
  const std::vector<double> step = advance_steps(steps);
  const bool master = !master_params.empty();
  const bool is_double = params[0].scalar_type() == at::kDouble;
  const at::Tensor norms = grad_norms.contiguous();
  const std::vector<at::Tensor> gs = grads_like_params(params, grads);
  // The per-tensor second moments, before any element reads its denom.
  std::vector<NovoGradCoeffs<float>> cf(params.size());
  std::vector<NovoGradCoeffs<double>> cd(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const double norm = (is_double ? element_at<double>(norms, i) : element_at<float>(norms, i)) / scale;
    const bool fresh = step[i] == 1.0 && !init_zero;
    double v;
    if (is_double) {
      double* vp = exp_avg_sqs[i].data_ptr<double>();
      v = *vp = novograd_second_moment(*vp, norm, beta2, fresh, norm_type);
    } else {
      float* vp = exp_avg_sqs[i].data_ptr<float>();
      v = *vp = static_cast<float>(novograd_second_moment(*vp, norm, beta2, fresh, norm_type));
    }
    cf[i] = novograd_coeffs<float>(lr, beta1, beta2, eps, weight_decay, step[i], v,
                                   norm_type, bias_correction, grad_averaging);
    cd[i] = novograd_coeffs<double>(lr, beta1, beta2, eps, weight_decay, step[i], v,
                                    norm_type, bias_correction, grad_averaging);
  }
  bool_switch(reg_inside_moment, [&](auto reg_inside) {
    for_each_param_chunk(params, master, [&](auto tag, auto has_master, const Chunk& ch) {
      using param_t = decltype(tag);
      const int64_t t = ch.tensor;
      const auto& c = [&]() -> const auto& {
        if constexpr (std::is_same_v<param_t, double>) return cd[t]; else return cf[t];
      }();
      novograd_chunk<reg_inside, has_master, param_t>(params[t].data_ptr(), gs[t].data_ptr(),
                                                      exp_avgs[t].data_ptr(),
                                                      master ? master_params[t].data_ptr() : nullptr,
                                                      ch.begin, ch.end, c, unscale);
    });
  });
  if (unscale.write) copy_back_grads(grads, gs);
}

}  // namespace

TORCH_LIBRARY_IMPL(core_ops, CPU, m) {
  m.impl("fused_novograd_", &fused_novograd_);
}

}  // namespace core_ops::cpu
