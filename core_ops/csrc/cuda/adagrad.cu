// CUDA kernel of fused_adagrad_: the checks of core_ops/optimizer_ops.h, the math of
// core_ops/adagrad_math.h, and found_inf, lr, grad_scale and the step counts kept on
// the device so the host never waits (Note [Fused optimizer ops] in _schemas.py).
//
// The pattern of adam.cu: one multi_tensor_apply pass, the step counts riding along
// as per-tensor scalars of the launch descriptor; each block derives its tensor's
// coefficients from that count + 1 (the step this update makes), and a second,
// stream-ordered kernel advances the counts once every block has read them.
#include <torch/csrc/stable/library.h>

#include <core_ops/adagrad_math.h>
#include <core_ops/optimizer_ops.h>

#include "optimizer_launch.cuh"

namespace core_ops::cuda {
namespace {

struct AdagradScalars {
  double lr, lr_decay, eps, weight_decay;
  StepScalars step;
};

// Lists (Note [One functor moves an optimizer's memory]): params, grads, state_sums,
// then master_params when present; one per-tensor scalar, the step count, after them.
template <typename acc_t, bool kWMode>
struct AdagradPolicy {
  static constexpr bool kGrads = true, kWritesWeights = true;
  static constexpr int kSlots = 1, kInputs = 0, kOutputs = 0, kScalars = 1;

  AdagradScalars s;

  template <typename Meta>
  __device__ AdagradCoeffs<acc_t> coeffs(const TensorScalars<Meta>& scalars) const {
    return adagrad_coeffs<acc_t>(s.step.lr.get(s.lr), s.lr_decay, s.eps, s.weight_decay, next_step(scalars));
  }

  __device__ void math(acc_t& x, acc_t g, acc_t (&st)[1], const acc_t (&)[1], acc_t (&)[1],
                       const AdagradCoeffs<acc_t>& c) const {
    adagrad_math<kWMode>(x, g, st[0], c);
  }
};

void adagrad_step(const AdagradArgs& a) {
  OptimizerLaunch launch(a.params, a.grads, a.lr_tensor, a.grad_scale, a.found_inf, a.maximize);
  const AdagradScalars s{a.lr, a.lr_decay, a.eps, a.weight_decay, launch.step()};
  bool_switch(a.adagrad_w_mode, [&](auto wmode) {
    launch.elementwise([&](auto, auto acc, auto) { return AdagradPolicy<decltype(acc), decltype(wmode)::value>{s}; },
                       {a.state_sums}, a.master_params, {a.steps});
  });
  launch.finish(a.steps);
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(core_ops, CUDA, m) {
  m.impl("fused_adagrad_", TORCH_BOX(&fused_adagrad_<adagrad_step>));
}

}  // namespace core_ops::cuda
