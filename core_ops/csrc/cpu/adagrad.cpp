// CPU kernel of fused_adagrad_: the math is core_ops/adagrad_math.h.
#include <torch/library.h>

#include <core_ops/adagrad_math.h>

#include "optimizer_step.h"

namespace core_ops::cpu {
namespace {

template <bool kWMode, bool kMaster, typename param_t>
void adagrad_chunk(void* param, void* grad, void* state_sum, void* master, int64_t begin,
                   int64_t end, const AdagradCoeffs<state_t<param_t>>& c,
                   const GradUnscale& unscale) {
  using acc_t = state_t<param_t>;
  auto* p = static_cast<param_t*>(param);
  auto* g = static_cast<param_t*>(grad);
  auto* s = static_cast<acc_t*>(state_sum);
  auto* w = static_cast<acc_t*>(master);
  const GradReader<acc_t> grads(unscale);
  int64_t i = begin;
  if constexpr (!std::is_same_v<param_t, double>) {
    for (; i + kWidth <= end; i += kWidth) {
      fVec p0, p1, g0, g1, s0, s1;
      if constexpr (kMaster) load2(w + i, p0, p1); else load2(p + i, p0, p1);
      grads.load(g + i, g0, g1);
      load2(s + i, s0, s1);
      adagrad_math<kWMode>(p0, g0, s0, c);
      adagrad_math<kWMode>(p1, g1, s1, c);
      store2(s + i, s0, s1);
      if constexpr (kMaster) store2(w + i, p0, p1);
      store2(p + i, p0, p1);
    }
  }
  for (; i < end; ++i) {
    acc_t pv = kMaster ? w[i] : static_cast<acc_t>(p[i]);
    adagrad_math<kWMode>(pv, grads.load(g + i), s[i], c);
    if constexpr (kMaster) w[i] = pv;
    p[i] = static_cast<param_t>(pv);
  }
}

void fused_adagrad_(at::TensorList params, at::TensorList grads, at::TensorList state_sums,
                    at::TensorList master_params, at::TensorList steps, double lr,
                    double lr_decay, double eps, double weight_decay, bool adagrad_w_mode,
                    bool maximize, const std::optional<at::Tensor>& lr_tensor,
                    const std::optional<at::Tensor>& grad_scale,
                    const std::optional<at::Tensor>& found_inf) {
  if (!check_optimizer_group(params, grads, steps, lr_tensor, grad_scale, found_inf)) return;
  check_state_list(params, state_sums, "state_sums", false);
  check_masters(params, master_params);
  check_layouts(params, {{state_sums, "state_sums"}, {master_params, "master_params"}});
  if (flag_is_set(found_inf)) return;

  lr = value_or(lr_tensor, lr);
  const GradUnscale unscale(grad_scale, maximize);
  const std::vector<double> step = advance_steps(steps);
  const bool master = !master_params.empty();
  const std::vector<at::Tensor> gs = grads_like_params(params, grads);
  std::vector<AdagradCoeffs<float>> cf(params.size());
  std::vector<AdagradCoeffs<double>> cd(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    cf[i] = adagrad_coeffs<float>(lr, lr_decay, eps, weight_decay, step[i]);
    cd[i] = adagrad_coeffs<double>(lr, lr_decay, eps, weight_decay, step[i]);
  }
  bool_switch(adagrad_w_mode, [&](auto wmode) {
    for_each_param_chunk(params, master, [&](auto tag, auto has_master, const Chunk& ch) {
      using param_t = decltype(tag);
      const int64_t t = ch.tensor;
      const auto& c = [&]() -> const auto& {
        if constexpr (std::is_same_v<param_t, double>) return cd[t]; else return cf[t];
      }();
      adagrad_chunk<wmode, has_master, param_t>(params[t].data_ptr(), gs[t].data_ptr(),
                                                state_sums[t].data_ptr(),
                                                master ? master_params[t].data_ptr() : nullptr,
                                                ch.begin, ch.end, c, unscale);
    });
  });
  if (unscale.write) copy_back_grads(grads, gs);
}

}  // namespace

TORCH_LIBRARY_IMPL(core_ops, CPU, m) {
  m.impl("fused_adagrad_", &fused_adagrad_);
}

}  // namespace core_ops::cpu
