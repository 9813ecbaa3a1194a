// CUDA kernel of fused_adam_: the checks of core_ops/optimizer_ops.h, the math of
// core_ops/adam_math.h, and found_inf, lr, grad_scale and the step counts kept on the
// device so the host never waits (Note [Fused optimizer ops] in _schemas.py).
//
// One multi_tensor_apply pass updates every tensor; the step counts ride along as
// per-tensor scalars of the launch descriptor (TensorListMeta's addresses[kDepth]):
// each block reads its own tensor's count there, so a tensor cut between two launches
// still finds it, and no pointer table is copied to the device. Each block derives its
// tensor's coefficients from that count + 1 (the step this update makes); a second,
// stream-ordered kernel then advances the counts, once every block has read them.
#include <torch/csrc/stable/library.h>

#include <core_ops/adam_math.h>
#include <core_ops/optimizer_ops.h>

#include "optimizer_launch.cuh"

namespace core_ops::cuda {
namespace {

// The step's scalars: the hyperparameters in double, as the schema gives them, and
// the device-side ones.
struct AdamScalars {
  double lr, beta1, beta2, eps, weight_decay;
  StepScalars step;
  bool bias_correction;
};

// Lists (Note [One functor moves an optimizer's memory]): params, grads, exp_avgs,
// exp_avg_sqs, then max_exp_avg_sqs (amsgrad) and master_params (master weights) when
// present; one per-tensor scalar, the step count, after them. acc_t is the state's and
// the math's type: float for float / half / bfloat16 params, double for double.
template <typename acc_t, bool kAdamW, bool kAmsgrad>
struct AdamPolicy {
  static constexpr bool kGrads = true, kWritesWeights = true;
  static constexpr int kSlots = 2 + int(kAmsgrad), kInputs = 0, kOutputs = 0, kScalars = 1;

  AdamScalars s;

  // Every thread derives the coefficients itself: two double pows once per chunk,
  // against the 128 elements a thread then moves; no shared memory, no barrier.
  template <typename Meta>
  __device__ AdamCoeffs<acc_t> coeffs(const TensorScalars<Meta>& scalars) const {
    return adam_coeffs<acc_t>(s.step.lr.get(s.lr), s.beta1, s.beta2, s.eps, s.weight_decay,
                              next_step(scalars), s.bias_correction);
  }

  __device__ void math(acc_t& x, acc_t g, acc_t (&st)[kSlots], const acc_t (&)[1], acc_t (&)[1],
                       const AdamCoeffs<acc_t>& c) const {
    acc_t unused = 0;
    if constexpr (kAmsgrad) {
      adam_math<kAdamW, true>(x, g, st[0], st[1], st[kSlots - 1], c);
    } else {
      adam_math<kAdamW, false>(x, g, st[0], st[1], unused, c);
    }
  }
};

void adam_step(const AdamArgs& a) {
  CORE_OPS_CHECK_TYPE(dtype_of(a.grads[0]) == dtype_of(a.params[0]), "grads have dtype ",
                      dtype_name(dtype_of(a.grads[0])), " but params have ", dtype_name(dtype_of(a.params[0])),
                      ": on CUDA, grads take the params' dtype (float32 grads with master_params are read by "
                      "the CPU kernel only, Note [Master grads])");
  OptimizerLaunch launch(a.params, a.grads, a.lr_tensor, a.grad_scale, a.found_inf, a.maximize);
  const AdamScalars s{a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, launch.step(), a.bias_correction};
  bool_switch(a.adam_w_mode, [&](auto adamw) {
    bool_switch(a.amsgrad, [&](auto ams) {
      const auto policy = [&](auto, auto acc, auto) {
        return AdamPolicy<decltype(acc), decltype(adamw)::value, decltype(ams)::value>{s};
      };
      launch.elementwise(policy, {a.exp_avgs, a.exp_avg_sqs, a.amsgrad ? a.max_exp_avg_sqs : TensorList()},
                         a.master_params, {a.steps});
    });
  });
  launch.finish(a.steps);
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(core_ops, CUDA, m) {
  m.impl("fused_adam_", TORCH_BOX(&fused_adam_<adam_step>));
}

}  // namespace core_ops::cuda
