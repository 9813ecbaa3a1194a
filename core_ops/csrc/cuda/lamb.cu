// CUDA kernels of fused_lamb_stage1_ and fused_lamb_stage2_: the checks of
// core_ops/optimizer_ops.h, the math of core_ops/lamb_math.h, and found_inf, lr,
// grad_scale, the step counts and the per-tensor norms kept on the device so the host
// never waits (Note [Fused optimizer ops] in _schemas.py). The per-tensor norms between the stages
// come from multi_tensor_l2norm (called by core_ops/optimizers/fused_lamb.py).
//
// The pattern of adam.cu. Stage 1: one multi_tensor_apply pass, the step counts
// riding along as per-tensor scalars; each block derives its tensor's coefficients
// from that count + 1, and a stream-ordered kernel advances the counts afterwards.
// Stage 2: param_norms[t] and update_norms[t] ride along the same way (one-element
// views of the device tensors), and each block computes its tensor's lamb_neg_step.
#include <vector>

#include <torch/csrc/stable/library.h>

#include <core_ops/lamb_math.h>
#include <core_ops/optimizer_ops.h>

#include "optimizer_launch.cuh"

namespace core_ops::cuda {
namespace {

// ---- stage 1 --------------------------------------------------------------------

struct Stage1Scalars {
  double beta1, beta2, eps, weight_decay;
  StepScalars step;
  bool bias_correction, grad_averaging;
};

// Lists (Note [One functor moves an optimizer's memory]): params, grads, exp_avgs,
// exp_avg_sqs, updates (written), then master_params when present; one per-tensor
// scalar, the step count, after them. The weights are only read.
template <typename acc_t, bool kAdamW>
struct Stage1Policy {
  static constexpr bool kGrads = true, kWritesWeights = false;
  static constexpr int kSlots = 2, kInputs = 0, kOutputs = 1, kScalars = 1;

  Stage1Scalars s;

  template <typename Meta>
  __device__ LambCoeffs<acc_t> coeffs(const TensorScalars<Meta>& scalars) const {
    return lamb_coeffs<acc_t>(s.beta1, s.beta2, s.eps, s.weight_decay, next_step(scalars), s.bias_correction,
                              s.grad_averaging);
  }

  __device__ void math(acc_t& x, acc_t g, acc_t (&st)[2], const acc_t (&)[1], acc_t (&out)[1],
                       const LambCoeffs<acc_t>& c) const {
    out[0] = lamb_stage1_math<kAdamW>(x, g, st[0], st[1], c);
  }
};

void lamb_stage1_step(const LambStage1Args& a) {
  OptimizerLaunch launch(a.params, a.grads, std::nullopt, a.grad_scale, a.found_inf, a.maximize);
  const Stage1Scalars s{a.beta1, a.beta2, a.eps, a.weight_decay, launch.step(), a.bias_correction,
                        a.grad_averaging};
  bool_switch(a.adam_w_mode, [&](auto adamw) {
    launch.elementwise([&](auto, auto acc, auto) { return Stage1Policy<decltype(acc), decltype(adamw)::value>{s}; },
                       {a.exp_avgs, a.exp_avg_sqs, a.updates}, a.master_params, {a.steps});
  });
  launch.finish(a.steps);
}

// ---- stage 2 --------------------------------------------------------------------

struct Stage2Scalars {
  double lr, weight_decay;
  StepScalars step;
  bool use_nvlamb;
};

// Lists (Note [One functor moves an optimizer's memory]): params, updates (read),
// then master_params when present; two per-tensor scalars after them: the tensor's
// param norm and update norm.
template <typename acc_t>
struct Stage2Policy {
  static constexpr bool kGrads = false, kWritesWeights = true;
  static constexpr int kSlots = 0, kInputs = 1, kOutputs = 0, kScalars = 2;

  Stage2Scalars s;

  template <typename Meta>
  __device__ acc_t coeffs(const TensorScalars<Meta>& scalars) const {  // the tensor's step, negated
    return lamb_neg_step<acc_t>(s.step.lr.get(s.lr), scalars.template get<acc_t>(0),
                                scalars.template get<acc_t>(1), s.weight_decay, s.use_nvlamb);
  }

  __device__ void math(acc_t& x, acc_t, acc_t (&)[1], const acc_t (&update)[1], acc_t (&)[1],
                       const acc_t& neg_step) const {
    lamb_stage2_math(x, update[0], neg_step);
  }
};

void lamb_stage2_step(const LambStage2Args& a) {
  OptimizerLaunch launch(a.params, {}, a.lr_tensor, std::nullopt, a.found_inf, /*maximize=*/false);
  const Stage2Scalars s{a.lr, a.weight_decay, launch.step(), a.use_nvlamb};
  const std::vector<Tensor> pn = per_tensor_views(a.param_norms), un = per_tensor_views(a.update_norms);
  launch.elementwise([&](auto, auto acc, auto) { return Stage2Policy<decltype(acc)>{s}; }, {a.updates},
                     a.master_params, {pn, un});
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(core_ops, CUDA, m) {
  m.impl("fused_lamb_stage1_", TORCH_BOX(&fused_lamb_stage1_<lamb_stage1_step>));
  m.impl("fused_lamb_stage2_", TORCH_BOX(&fused_lamb_stage2_<lamb_stage2_step>));
}

}  // namespace core_ops::cuda
