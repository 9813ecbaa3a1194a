// CUDA kernel of fused_sgd_: the checks of core_ops/optimizer_ops.h, the math of
// core_ops/sgd_math.h, and found_inf, lr and grad_scale read on the device so the
// host never waits (Note [Fused optimizer ops] in _schemas.py). The pattern of
// adam.cu: one multi_tensor_apply pass; SGD keeps no step count, so there is no
// per-tensor scalar and no step-advance kernel. first_step and wd_after_momentum are
// runtime flags of SgdCoeffs, as on the CPU.
#include <type_traits>

#include <torch/csrc/stable/library.h>

#include <core_ops/optimizer_ops.h>
#include <core_ops/sgd_math.h>

#include "optimizer_launch.cuh"

namespace core_ops::cuda {
namespace {

struct SgdScalars {
  double lr, momentum, dampening, weight_decay;
  StepScalars step;
  bool first_step, wd_after_momentum;
};

// Lists (Note [One functor moves an optimizer's memory]): params, grads, then
// momentum_buffers (momentum != 0) and master_params (master weights) when present.
template <typename param_t, typename acc_t, bool kMaster, bool kMomentum, bool kNesterov>
struct SgdPolicy {
  static constexpr bool kGrads = true, kWritesWeights = true;
  static constexpr int kSlots = int(kMomentum), kInputs = 0, kOutputs = 0, kScalars = 0;
  // Note [Half params without masters]: torch's roundings for a half param alone.
  using Round = std::conditional_t<!kMaster && !std::is_same_v<param_t, acc_t>, RoundTo<param_t>, NoRound>;

  SgdScalars s;

  template <typename Meta>
  __device__ SgdCoeffs<acc_t> coeffs(const TensorScalars<Meta>&) const {
    return sgd_coeffs<acc_t>(s.step.lr.get(s.lr), s.momentum, s.dampening, s.weight_decay, s.first_step,
                             s.wd_after_momentum);
  }

  __device__ void math(acc_t& x, acc_t g, acc_t (&st)[1], const acc_t (&)[1], acc_t (&)[1],
                       const SgdCoeffs<acc_t>& c) const {
    acc_t none = 0;  // no momentum buffer: sgd_math leaves it alone
    sgd_math<kMomentum, kNesterov>(x, g, kMomentum ? st[0] : none, c, Round());
  }
};

void sgd_step(const SgdArgs& a) {
  OptimizerLaunch launch(a.params, a.grads, a.lr_tensor, a.grad_scale, a.found_inf, a.maximize);
  const SgdScalars s{a.lr, a.momentum, a.dampening, a.weight_decay, launch.step(), a.first_step,
                     a.wd_after_momentum};
  const bool has_momentum = a.momentum != 0.0;
  bool_switch(has_momentum, [&](auto mom) {
    bool_switch(a.nesterov && has_momentum, [&](auto nest) {
      constexpr bool kMom = decltype(mom)::value;
      constexpr bool kNest = decltype(nest)::value && kMom;
      launch.elementwise([&](auto param, auto acc, auto master) {
        return SgdPolicy<decltype(param), decltype(acc), decltype(master)::value, kMom, kNest>{s};
      }, {has_momentum ? a.momentum_buffers : TensorList()}, a.master_params);
    });
  });
  launch.finish({});  // SGD keeps no step count
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(core_ops, CUDA, m) {
  m.impl("fused_sgd_", TORCH_BOX(&fused_sgd_<sgd_step>));
}

}  // namespace core_ops::cuda
