// CPU kernel of fused_adam_: the math is core_ops/adam_math.h; this file moves memory.
#include <torch/library.h>

#include <core_ops/adam_math.h>

#include "optimizer_step.h"

namespace core_ops::cpu {
namespace {

struct AdamPtrs {
  void* param;
  void* grad;
  void* exp_avg;
  void* exp_avg_sq;
  void* max_exp_avg_sq;  // amsgrad only
  void* master;          // master weights only
};

// One chunk [begin, end) of one tensor. The weights the math updates are the fp32
// master copy when there is one, else the param itself (in the state type).
// kUnscale is false when the grads are divided by 1: g / 1 == g exactly, and a vector
// division is the costliest instruction of the loop (bf16 params leave it compute-bound).
template <bool kAdamW, bool kAmsgrad, bool kMaster, bool kUnscale, typename param_t>
void adam_chunk(const AdamPtrs& t, int64_t begin, int64_t end,
                const AdamCoeffs<state_t<param_t>>& c, const GradUnscale& unscale) {
  using acc_t = state_t<param_t>;
  auto* p = static_cast<param_t*>(t.param);
  auto* g = static_cast<param_t*>(t.grad);
  auto* m = static_cast<acc_t*>(t.exp_avg);
  auto* v = static_cast<acc_t*>(t.exp_avg_sq);
  auto* vmax = static_cast<acc_t*>(t.max_exp_avg_sq);
  auto* w = static_cast<acc_t*>(t.master);
  const GradReader<acc_t> grads(unscale);
  int64_t i = begin;
  if constexpr (!std::is_same_v<param_t, double>) {
    for (; i + kWidth <= end; i += kWidth) {
      fVec p0, p1, g0, g1, m0, m1, v0, v1, x0, x1;
      if constexpr (kMaster) load2(w + i, p0, p1); else load2(p + i, p0, p1);
      if constexpr (kUnscale) grads.load(g + i, g0, g1); else load2(g + i, g0, g1);
      load2(m + i, m0, m1);
      load2(v + i, v0, v1);
      if constexpr (kAmsgrad) load2(vmax + i, x0, x1);
      adam_math<kAdamW, kAmsgrad>(p0, g0, m0, v0, x0, c);
      adam_math<kAdamW, kAmsgrad>(p1, g1, m1, v1, x1, c);
      store2(m + i, m0, m1);
      store2(v + i, v0, v1);
      if constexpr (kAmsgrad) store2(vmax + i, x0, x1);
      if constexpr (kMaster) store2(w + i, p0, p1);
      store2(p + i, p0, p1);
    }
  }
  for (; i < end; ++i) {
    acc_t pv = kMaster ? w[i] : static_cast<acc_t>(p[i]);
    acc_t xv = kAmsgrad ? vmax[i] : acc_t(0);
    const acc_t gv = kUnscale ? grads.load(g + i) : static_cast<acc_t>(g[i]);
    adam_math<kAdamW, kAmsgrad>(pv, gv, m[i], v[i], xv, c);
    if constexpr (kAmsgrad) vmax[i] = xv;
    if constexpr (kMaster) w[i] = pv;
    p[i] = static_cast<param_t>(pv);
  }
}

void fused_adam_(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                 at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs,
                 at::TensorList master_params, at::TensorList steps, double lr, double beta1,
                 double beta2, double eps, double weight_decay, bool adam_w_mode,
                 bool bias_correction, bool amsgrad, bool maximize,
                 const std::optional<at::Tensor>& lr_tensor,
                 const std::optional<at::Tensor>& grad_scale,
                 const std::optional<at::Tensor>& found_inf) {
  if (!check_optimizer_group(params, grads, steps, lr_tensor, grad_scale, found_inf)) return;
  check_state_list(params, exp_avgs, "exp_avgs", false);
  check_state_list(params, exp_avg_sqs, "exp_avg_sqs", false);
  check_state_list(params, max_exp_avg_sqs, "max_exp_avg_sqs", !amsgrad);
  TORCH_CHECK_VALUE(!amsgrad || !max_exp_avg_sqs.empty(), "amsgrad needs max_exp_avg_sqs");
  check_masters(params, master_params);
  check_layouts(params, {{exp_avgs, "exp_avgs"}, {exp_avg_sqs, "exp_avg_sqs"},
                         {max_exp_avg_sqs, "max_exp_avg_sqs"}, {master_params, "master_params"}});
  if (flag_is_set(found_inf)) return;  // a skipped step changes nothing, steps included

  lr = value_or(lr_tensor, lr);
  const GradUnscale unscale(grad_scale, maximize);
  const std::vector<double> step = advance_steps(steps);
  const bool master = !master_params.empty();

  const std::vector<at::Tensor> gs = grads_like_params(params, grads);
  std::vector<AdamPtrs> ptrs(params.size());
  std::vector<AdamCoeffs<float>> cf(params.size());
  std::vector<AdamCoeffs<double>> cd(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    ptrs[i] = {params[i].data_ptr(), gs[i].data_ptr(), exp_avgs[i].data_ptr(),
               exp_avg_sqs[i].data_ptr(), amsgrad ? max_exp_avg_sqs[i].data_ptr() : nullptr,
               master ? master_params[i].data_ptr() : nullptr};
    cf[i] = adam_coeffs<float>(lr, beta1, beta2, eps, weight_decay, step[i], bias_correction);
    cd[i] = adam_coeffs<double>(lr, beta1, beta2, eps, weight_decay, step[i], bias_correction);
  }
  bool_switch(adam_w_mode, [&](auto adamw) {
    bool_switch(amsgrad, [&](auto ams) {
      bool_switch(unscale.div() != 1.0, [&](auto divide) {
        for_each_param_chunk(params, master, [&](auto tag, auto has_master, const Chunk& ch) {
          using param_t = decltype(tag);
          const auto& c = [&]() -> const auto& {
            if constexpr (std::is_same_v<param_t, double>) return cd[ch.tensor]; else return cf[ch.tensor];
          }();
          adam_chunk<adamw, ams, has_master, divide, param_t>(ptrs[ch.tensor], ch.begin, ch.end,
                                                              c, unscale);
        });
      });
    });
  });
  if (unscale.write) copy_back_grads(grads, gs);
}

}  // namespace

TORCH_LIBRARY_IMPL(core_ops, CPU, m) {
  m.impl("fused_adam_", &fused_adam_);
}

}  // namespace core_ops::cpu
