// CPU kernel of fused_sgd_: the math is core_ops/sgd_math.h; this file moves memory.
#include <type_traits>

#include <torch/library.h>

#include <core_ops/sgd_math.h>

#include "optimizer_step.h"

namespace core_ops::cpu {
namespace {

template <bool kMomentum, bool kNesterov, bool kMaster, typename param_t>
void sgd_chunk(void* param, void* grad, void* buffer, void* master, int64_t begin,
               int64_t end, const SgdCoeffs<state_t<param_t>>& c, const GradUnscale& unscale) {
  using acc_t = state_t<param_t>;
  auto* p = static_cast<param_t*>(param);
  auto* g = static_cast<param_t*>(grad);
  auto* b = static_cast<acc_t*>(buffer);
  auto* w = static_cast<acc_t*>(master);
  const GradReader<acc_t> grads(unscale);
  // Note [Half params without masters]: torch's roundings for a half param alone.
  using Round = std::conditional_t<!kMaster && !std::is_same_v<param_t, acc_t>, RoundTo<param_t>, NoRound>;
  const Round round;
  int64_t i = begin;
  if constexpr (!std::is_same_v<param_t, double>) {
    for (; i + kWidth <= end; i += kWidth) {
      fVec p0, p1, g0, g1, b0, b1;
      if constexpr (kMaster) load2(w + i, p0, p1); else load2(p + i, p0, p1);
      grads.load(g + i, g0, g1);
      if constexpr (kMomentum) load2(b + i, b0, b1);
      sgd_math<kMomentum, kNesterov>(p0, g0, b0, c, round);
      sgd_math<kMomentum, kNesterov>(p1, g1, b1, c, round);
      if constexpr (kMomentum) store2(b + i, b0, b1);
      if constexpr (kMaster) store2(w + i, p0, p1);
      store2(p + i, p0, p1);
    }
  }
  for (; i < end; ++i) {
    acc_t pv = kMaster ? w[i] : static_cast<acc_t>(p[i]);
    acc_t bv = kMomentum ? b[i] : acc_t(0);
    sgd_math<kMomentum, kNesterov>(pv, grads.load(g + i), bv, c, round);
    if constexpr (kMomentum) b[i] = bv;
    if constexpr (kMaster) w[i] = pv;
    p[i] = static_cast<param_t>(pv);
  }
}

void fused_sgd_(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers,
                at::TensorList master_params, double lr, double momentum, double dampening,
                double weight_decay, bool nesterov, bool wd_after_momentum, bool first_step,
                bool maximize, const std::optional<at::Tensor>& lr_tensor,
                const std::optional<at::Tensor>& grad_scale,
                const std::optional<at::Tensor>& found_inf) {
  if (!check_optimizer_group(params, grads, {}, lr_tensor, grad_scale, found_inf,
                             /*has_steps=*/false)) {
    return;
  }
  const bool has_momentum = momentum != 0.0;
  check_state_list(params, momentum_buffers, "momentum_buffers", !has_momentum);
  TORCH_CHECK_VALUE(!has_momentum || !momentum_buffers.empty(), "momentum needs momentum_buffers");
  TORCH_CHECK_VALUE(!nesterov || has_momentum, "nesterov needs momentum > 0");
  check_masters(params, master_params);
  check_layouts(params, {{momentum_buffers, "momentum_buffers"}, {master_params, "master_params"}});
  if (flag_is_set(found_inf)) return;

  lr = value_or(lr_tensor, lr);
  const GradUnscale unscale(grad_scale, maximize);
  const bool master = !master_params.empty();
  const std::vector<at::Tensor> gs = grads_like_params(params, grads);
  const auto cf = sgd_coeffs<float>(lr, momentum, dampening, weight_decay, first_step, wd_after_momentum);
  const auto cd = sgd_coeffs<double>(lr, momentum, dampening, weight_decay, first_step, wd_after_momentum);
  bool_switch(has_momentum, [&](auto mom) {
    bool_switch(nesterov, [&](auto nest) {
      for_each_param_chunk(params, master, [&](auto tag, auto has_master, const Chunk& ch) {
        using param_t = decltype(tag);
        const auto& c = [&]() -> const auto& {
          if constexpr (std::is_same_v<param_t, double>) return cd; else return cf;
        }();
        const int64_t t = ch.tensor;
        sgd_chunk<mom, nest && mom, has_master, param_t>(
            params[t].data_ptr(), gs[t].data_ptr(), mom ? momentum_buffers[t].data_ptr() : nullptr,
            master ? master_params[t].data_ptr() : nullptr, ch.begin, ch.end, c, unscale);
      });
    });
  });
  if (unscale.write) copy_back_grads(grads, gs);
}

}  // namespace

TORCH_LIBRARY_IMPL(core_ops, CPU, m) {
  m.impl("fused_sgd_", &fused_sgd_);
}

}  // namespace core_ops::cpu
