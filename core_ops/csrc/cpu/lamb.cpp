// CPU kernels of fused_lamb_stage1_ and fused_lamb_stage2_: the checks are
// core_ops/optimizer_ops.h, the math core_ops/lamb_math.h; the per-tensor norms between the stages come from
// multi_tensor_l2norm (called by core_ops/optimizers/fused_lamb.py).
#include <torch/csrc/stable/library.h>

#include <core_ops/lamb_math.h>

#include "level.h"
#include "optimizer_step.h"

CORE_OPS_CPU_BEGIN
namespace {

template <bool kAdamW, bool kMaster, typename param_t>
void stage1_chunk(const void* param, void* grad, void* exp_avg, void* exp_avg_sq,
                  const void* master, void* update, int64_t begin, int64_t end,
                  const LambCoeffs<state_t<param_t>>& c, const GradUnscale& unscale) {
  using acc_t = state_t<param_t>;
  auto* p = static_cast<const param_t*>(param);
  auto* g = static_cast<param_t*>(grad);
  auto* m = static_cast<acc_t*>(exp_avg);
  auto* v = static_cast<acc_t*>(exp_avg_sq);
  auto* w = static_cast<const acc_t*>(master);
  auto* u = static_cast<acc_t*>(update);
  const GradReader<acc_t> grads(unscale);
  int64_t i = begin;
  if constexpr (!std::is_same_v<param_t, double>) {
    for (; i + kWidth <= end; i += kWidth) {
      fVec p0, p1, g0, g1, m0, m1, v0, v1;
      if constexpr (kMaster) load2(w + i, p0, p1); else load2(p + i, p0, p1);
      grads.load(g + i, g0, g1);
      load2(m + i, m0, m1);
      load2(v + i, v0, v1);
      const fVec u0 = lamb_stage1_math<kAdamW>(p0, g0, m0, v0, c);
      const fVec u1 = lamb_stage1_math<kAdamW>(p1, g1, m1, v1, c);
      store2(m + i, m0, m1);
      store2(v + i, v0, v1);
      store2(u + i, u0, u1);
    }
  }
  for (; i < end; ++i) {
    const acc_t pv = kMaster ? w[i] : static_cast<acc_t>(p[i]);
    u[i] = lamb_stage1_math<kAdamW>(pv, grads.load(g + i), m[i], v[i], c);
  }
}

void lamb_stage1_step(const LambStage1Args& a) {
  if (flag_is_set(a.found_inf)) return;
  const CpuStep st(a.params, a.grads, a.steps, /*lr=*/0.0, std::nullopt, a.grad_scale, a.maximize);
  const bool master = !a.master_params.empty();
  bool_switch(a.adam_w_mode, [&](auto adamw) {
    for_each_param_chunk(a.params, master, [&](auto tag, auto has_master, const Chunk& ch) {
      using param_t = decltype(tag);
      const int64_t t = ch.tensor;
      const auto c = lamb_coeffs<state_t<param_t>>(a.beta1, a.beta2, a.eps, a.weight_decay, st.step[t],
                                                   a.bias_correction, a.grad_averaging);
      stage1_chunk<adamw, has_master, param_t>(
          a.params[t].data_ptr(), st.grads[t].data_ptr(), a.exp_avgs[t].data_ptr(), a.exp_avg_sqs[t].data_ptr(),
          master ? a.master_params[t].data_ptr() : nullptr, a.updates[t].data_ptr(), ch.begin, ch.end,
          c, st.unscale);
    });
  });
  st.finish(a.grads);
}

template <bool kMaster, typename param_t>
void stage2_chunk(void* param, void* master, const void* update, int64_t begin, int64_t end,
                  state_t<param_t> neg_step) {
  using acc_t = state_t<param_t>;
  auto* p = static_cast<param_t*>(param);
  auto* w = static_cast<acc_t*>(master);
  auto* u = static_cast<const acc_t*>(update);
  int64_t i = begin;
  if constexpr (!std::is_same_v<param_t, double>) {
    for (; i + kWidth <= end; i += kWidth) {
      fVec p0, p1, u0, u1;
      if constexpr (kMaster) load2(w + i, p0, p1); else load2(p + i, p0, p1);
      load2(u + i, u0, u1);
      lamb_stage2_math(p0, u0, neg_step);
      lamb_stage2_math(p1, u1, neg_step);
      if constexpr (kMaster) store2(w + i, p0, p1);
      store2(p + i, p0, p1);
    }
  }
  for (; i < end; ++i) {
    acc_t pv = kMaster ? w[i] : static_cast<acc_t>(p[i]);
    lamb_stage2_math(pv, u[i], neg_step);
    if constexpr (kMaster) w[i] = pv;
    p[i] = static_cast<param_t>(pv);
  }
}

void lamb_stage2_step(const LambStage2Args& a) {
  if (flag_is_set(a.found_inf)) return;
  const double lr = value_or(a.lr_tensor, a.lr);
  const Tensor pn = core_ops::contiguous(a.param_norms), un = core_ops::contiguous(a.update_norms);
  const bool master = !a.master_params.empty();
  for_each_param_chunk(a.params, master, [&](auto tag, auto has_master, const Chunk& ch) {
    using param_t = decltype(tag);
    using acc_t = state_t<param_t>;
    const int64_t t = ch.tensor;
    const acc_t neg_step = lamb_neg_step<acc_t>(lr, data<acc_t>(pn)[t], data<acc_t>(un)[t],
                                                a.weight_decay, a.use_nvlamb);
    stage2_chunk<has_master, param_t>(a.params[t].data_ptr(),
                                      master ? a.master_params[t].data_ptr() : nullptr,
                                      a.updates[t].data_ptr(), ch.begin, ch.end, neg_step);
  });
}

}  // namespace
CORE_OPS_CPU_END

CORE_OPS_CPU_OPTIMIZER(fused_lamb_stage1_, lamb_stage1_step)
CORE_OPS_CPU_OPTIMIZER(fused_lamb_stage2_, lamb_stage2_step)
