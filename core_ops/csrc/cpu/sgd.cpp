// CPU kernel of fused_sgd_: the checks are core_ops/optimizer_ops.h, the math
// core_ops/sgd_math.h; this file moves memory.
#include <type_traits>

#include <torch/library.h>

#include <core_ops/sgd_math.h>

#include "optimizer_step.h"

namespace core_ops::cpu {
namespace {

void sgd_step(const SgdArgs& a) {
  if (flag_is_set(a.found_inf)) return;
  const double lr = value_or(a.lr_tensor, a.lr);
  const GradUnscale unscale(a.grad_scale, a.maximize);
  const std::vector<at::Tensor> gs = grads_like_params(a.params, a.grads);
  const auto cf = sgd_coeffs<float>(lr, a.momentum, a.dampening, a.weight_decay, a.first_step,
                                    a.wd_after_momentum);
  const auto cd = sgd_coeffs<double>(lr, a.momentum, a.dampening, a.weight_decay, a.first_step,
                                     a.wd_after_momentum);
  const bool has_momentum = a.has_momentum();
  bool_switch(has_momentum, [&](auto mom) {
    bool_switch(a.nesterov && has_momentum, [&](auto nest) {
      step_params<mom ? 1 : 0>(
          a.params, gs, a.master_params, {has_momentum ? a.momentum_buffers : at::TensorList()}, unscale,
          [&](auto tag, auto has_master, int64_t) {
            using param_t = decltype(tag);
            // Note [Half params without masters]: torch's roundings for a half param alone.
            using Round = std::conditional_t<!decltype(has_master)::value && !std::is_same_v<param_t, state_t<param_t>>,
                                             RoundTo<param_t>, NoRound>;
            const auto& c = for_type<param_t>(cf, cd);
            return [&](auto& x, auto g, auto& s) {
              if constexpr (mom) {
                sgd_math<true, nest>(x, g, s[0], c, Round());
              } else {
                auto none = g;  // no momentum buffer: sgd_math leaves it alone
                sgd_math<false, false>(x, g, none, c, Round());
              }
            };
          });
    });
  });
  if (unscale.write) copy_back_grads(a.grads, gs);
}

}  // namespace

TORCH_LIBRARY_IMPL(core_ops, CPU, m) {
  m.impl("fused_sgd_", &fused_sgd_<sgd_step>);
}

}  // namespace core_ops::cpu
