// CUDA kernel of fused_novograd_: the checks of core_ops/optimizer_ops.h, the math of
// core_ops/novograd_math.h, and found_inf, lr, grad_scale, the grad norms, the
// per-tensor second moments and the step counts kept on the device so the host never
// waits (Note [Fused optimizer ops] in _schemas.py). The per-tensor grad norms come in
// (L2 or max|g| as norm_type says, taken by core_ops/optimizers/fused_novograd.py).
//
// The pattern of adam.cu, with the per-tensor part of csrc/cpu/novograd.cpp done on
// the device, stream-ordered:
//   1. one block per tensor updates its second moment exp_avg_sqs[t] from the stored
//      value, grad_norms[t] / grad_scale and the step this update makes (count + 1),
//      rounded to the state dtype as the CPU kernel stores it: before any element
//      reads its denom;
//   2. one multi_tensor_apply pass updates every element; each block derives its
//      tensor's NovoGradCoeffs from the count + 1 and the stored second moment, both
//      per-tensor scalars of the launch descriptor;
//   3. advance_steps advances the counts once every block has read them.
#include <vector>

#include <torch/csrc/stable/library.h>

#include <core_ops/novograd_math.h>
#include <core_ops/optimizer_ops.h>

#include "optimizer_launch.cuh"

namespace core_ops::cuda {
namespace {

struct NovoGradScalars {
  double lr, beta1, beta2, eps, weight_decay;
  StepScalars step;
  int64_t norm_type;
  bool bias_correction, grad_averaging, init_zero;
};

// Step 1: the walked list is exp_avg_sqs (one element per tensor, so one block per
// tensor); per-tensor scalars: the step count, then the grad norm.
template <typename acc_t>
struct SecondMomentOp {
  using Meta = TensorListMeta<1, 2>;

  NovoGradScalars s;

  __device__ void operator()(const Meta& meta, int t, int64_t, int, int64_t) const {
    if (threadIdx.x != 0 || flag_is_set(s.step.found_inf)) return;
    acc_t* v = static_cast<acc_t*>(meta.addresses[0][t]);
    const float step = *static_cast<const float*>(meta.addresses[1][t]) + 1.f;
    const double norm = static_cast<double>(*static_cast<const acc_t*>(meta.addresses[2][t])) /
                        s.step.grad_scale.get(1.0);
    const bool fresh = step == 1.f && !s.init_zero;
    *v = static_cast<acc_t>(novograd_second_moment(static_cast<double>(*v), norm, s.beta2, fresh,
                                                   s.norm_type));
  }
};

// Step 2. Lists (Note [One functor moves an optimizer's memory]): params, grads,
// exp_avgs, then master_params when present; two per-tensor scalars after them: the
// step count and the (updated) second moment.
template <typename acc_t, bool kRegInside>
struct NovoGradPolicy {
  static constexpr bool kGrads = true, kWritesWeights = true;
  static constexpr int kSlots = 1, kInputs = 0, kOutputs = 0, kScalars = 2;

  NovoGradScalars s;

  // v is the stored (rounded) second moment step 1 wrote.
  template <typename Meta>
  __device__ NovoGradCoeffs<acc_t> coeffs(const TensorScalars<Meta>& scalars) const {
    const double v = static_cast<double>(scalars.template get<acc_t>(1));
    return novograd_coeffs<acc_t>(s.step.lr.get(s.lr), s.beta1, s.beta2, s.eps, s.weight_decay,
                                  next_step(scalars), v, s.norm_type, s.bias_correction, s.grad_averaging);
  }

  __device__ void math(acc_t& x, acc_t g, acc_t (&st)[1], const acc_t (&)[1], acc_t (&)[1],
                       const NovoGradCoeffs<acc_t>& c) const {
    novograd_math<kRegInside>(x, g, st[0], c);
  }
};

void novograd_step(const NovogradArgs& a) {
  OptimizerLaunch launch(a.params, a.grads, a.lr_tensor, a.grad_scale, a.found_inf, a.maximize);
  const NovoGradScalars s{a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, launch.step(), a.norm_type,
                          a.bias_correction, a.grad_averaging, a.init_zero};
  const std::vector<Tensor> norms = per_tensor_views(a.grad_norms);
  if (dtype_of(a.params[0]) == ScalarType::Double) {
    multi_tensor_apply<1, 2>({a.exp_avg_sqs}, {a.steps, norms}, SecondMomentOp<double>{s});
  } else {
    multi_tensor_apply<1, 2>({a.exp_avg_sqs}, {a.steps, norms}, SecondMomentOp<float>{s});
  }
  bool_switch(a.reg_inside_moment, [&](auto reg_inside) {
    const auto policy = [&](auto, auto acc, auto) {
      return NovoGradPolicy<decltype(acc), decltype(reg_inside)::value>{s};
    };
    launch.elementwise(policy, {a.exp_avgs}, a.master_params, {a.steps, a.exp_avg_sqs});
  });
  launch.finish(a.steps);
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(core_ops, CUDA, m) {
  m.impl("fused_novograd_", TORCH_BOX(&fused_novograd_<novograd_step>));
}

}  // namespace core_ops::cuda
