// CUDA kernel of fused_adam_: the checks of csrc/cpu/adam.cpp, the math of
// core_ops/adam_math.h, and found_inf, lr, grad_scale and the step counts kept on the
// device so the host never waits (Note [Fused optimizer ops] in _library.py).
//
// One multi_tensor_apply pass updates every tensor; the step counts ride along as
// per-tensor scalars of the launch descriptor (TensorListMeta's addresses[kDepth]):
// each block reads its own tensor's count there, so a tensor cut between two launches
// still finds it, and no pointer table is copied to the device. Each block derives its
// tensor's coefficients from that count + 1 (the step this update makes); a second,
// stream-ordered kernel then advances the counts, once every block has read them.
#include <type_traits>
#include <vector>

#include <torch/library.h>

#include <core_ops/adam_math.h>
#include <core_ops/dispatch.h>
#include <core_ops/optimizer_args.h>

#include "multi_tensor_apply.cuh"
#include "optimizer_step.cuh"

namespace core_ops::cuda {
namespace {

// The step's scalars: the hyperparameters in double, as the schema gives them, and
// the device-side ones.
struct AdamScalars {
  double lr, beta1, beta2, eps, weight_decay;
  DeviceScalar lr_tensor, grad_scale;
  FoundInf found_inf;
  bool bias_correction, maximize;
};

// Lists (Note [One functor moves an optimizer's memory]): params, grads, exp_avgs,
// exp_avg_sqs, then max_exp_avg_sqs (amsgrad) and master_params (master weights) when
// present; one per-tensor scalar, the step count, after them. param_t is the params'
// (and grads') dtype, acc_t the state's and the math's: float for float / half /
// bfloat16 params, double for double.
template <typename param_t_, typename acc_t_, bool kAdamW, bool kAmsgrad, bool kMaster_>
struct AdamPolicy {
  using param_t = param_t_;
  using acc_t = acc_t_;
  static constexpr bool kGrads = true, kMaster = kMaster_, kWritesWeights = true;
  static constexpr int kSlots = 2 + int(kAmsgrad), kInputs = 0, kOutputs = 0, kScalars = 1;

  AdamScalars s;

  __device__ const FoundInf& flag() const { return s.found_inf; }

  __device__ GradReader<acc_t> grads() const { return GradReader<acc_t>(s.grad_scale, s.maximize); }

  // Every thread derives the coefficients itself: two double pows once per chunk,
  // against the 128 elements a thread then moves; no shared memory, no barrier.
  template <typename Meta>
  __device__ AdamCoeffs<acc_t> coeffs(const TensorScalars<Meta>& scalars) const {
    return adam_coeffs<acc_t>(s.lr_tensor.get(s.lr), s.beta1, s.beta2, s.eps, s.weight_decay,
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

struct AdamLists {
  at::TensorList params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, master_params, steps;
};

template <typename param_t, typename acc_t, bool kAdamW, bool kAmsgrad, bool kMaster>
void launch_adam(const AdamLists& l, const AdamScalars& s) {
  using Op = ElementwiseStep<AdamPolicy<param_t, acc_t, kAdamW, kAmsgrad, kMaster>>;
  std::vector<at::TensorList> lists{l.params, l.grads, l.exp_avgs, l.exp_avg_sqs};
  if constexpr (kAmsgrad) lists.push_back(l.max_exp_avg_sqs);
  if constexpr (kMaster) lists.push_back(l.master_params);
  multi_tensor_apply<Op::kDepth, 1>(to_array<Op::kDepth>(lists), {l.steps}, Op{{s}});
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
  check_state_list(params, master_params, "master_params", true);
  check_layouts(params, {{exp_avgs, "exp_avgs"}, {exp_avg_sqs, "exp_avg_sqs"},
                         {max_exp_avg_sqs, "max_exp_avg_sqs"}, {master_params, "master_params"}});
  const auto device = params[0].device();
  check_cuda(device);
  const bool is_double = params[0].scalar_type() == at::kDouble;
  const bool master = !master_params.empty();
  TORCH_CHECK_VALUE(!(is_double && master), "float64 params take no master_params");
  const c10::cuda::CUDAGuard guard(device);

  at::Tensor lr_keep, scale_keep;
  const AdamScalars s{lr, beta1, beta2, eps, weight_decay,
                      device_scalar_arg(lr_tensor, lr_keep), device_scalar_arg(grad_scale, scale_keep),
                      optional_flag(found_inf), bias_correction, maximize};

  const std::vector<at::Tensor> gs = grads_like_params(params, grads);
  bool strided = false;
  for (const auto& p : params) strided = strided || !p.is_contiguous();
  FlatLists flat;
  flat.storage.reserve(6);  // the TensorLists below point into it: no reallocation
  const AdamLists lists{flat(params, strided), flat(gs, strided), flat(exp_avgs, strided),
                        flat(exp_avg_sqs, strided), flat(amsgrad ? max_exp_avg_sqs : at::TensorList(), strided),
                        flat(master_params, strided), steps};

  bool_switch(adam_w_mode, [&](auto adamw) {
    bool_switch(amsgrad, [&](auto ams) {
      if (is_double) {
        launch_adam<double, double, decltype(adamw)::value, decltype(ams)::value, false>(lists, s);
        return;
      }
      bool_switch(master, [&](auto has_master) {
        CORE_OPS_DISPATCH_FLOAT_HALF_BF16(params[0].scalar_type(), "params", param_t,
          (launch_adam<param_t, float, decltype(adamw)::value, decltype(ams)::value,
                       decltype(has_master)::value>(lists, s)));
      });
    });
  });
  if (grad_scale.has_value()) copy_back_grads(grads, gs);  // values the kernel wrote, or the same
  advance_steps(steps, s.found_inf);
}

}  // namespace

TORCH_LIBRARY_IMPL(core_ops, CUDA, m) {
  m.impl("fused_adam_", &fused_adam_);
}

}  // namespace core_ops::cuda
