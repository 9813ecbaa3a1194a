// CUDA kernels of fused_lamb_stage1_ and fused_lamb_stage2_: the checks of
// csrc/cpu/lamb.cpp, the math of core_ops/lamb_math.h, and found_inf, lr, grad_scale,
// the step counts and the per-tensor norms kept on the device so the host never waits
// (Note [Fused optimizer ops] in _library.py). The per-tensor norms between the stages
// come from multi_tensor_l2norm (called by core_ops/optimizers/fused_lamb.py).
//
// The pattern of adam.cu. Stage 1: one multi_tensor_apply pass, the step counts
// riding along as per-tensor scalars; each block derives its tensor's coefficients
// from that count + 1, and a stream-ordered kernel advances the counts afterwards.
// Stage 2: param_norms[t] and update_norms[t] ride along the same way (one-element
// views of the device tensors), and each block computes its tensor's lamb_neg_step.
#include <type_traits>
#include <vector>

#include <torch/library.h>

#include <core_ops/dispatch.h>
#include <core_ops/lamb_math.h>
#include <core_ops/optimizer_args.h>

#include "multi_tensor_apply.cuh"
#include "optimizer_step.cuh"

namespace core_ops::cuda {
namespace {

bool any_strided(at::TensorList params) {
  bool strided = false;
  for (const auto& p : params) strided = strided || !p.is_contiguous();
  return strided;
}

// ---- stage 1 --------------------------------------------------------------------

struct Stage1Scalars {
  double beta1, beta2, eps, weight_decay;
  DeviceScalar grad_scale;
  FoundInf found_inf;
  bool bias_correction, grad_averaging, maximize;
};

// Lists (Note [One functor moves an optimizer's memory]): params, grads, exp_avgs,
// exp_avg_sqs, updates (written), then master_params when present; one per-tensor
// scalar, the step count, after them. The weights are only read.
template <typename param_t_, typename acc_t_, bool kAdamW, bool kMaster_>
struct Stage1Policy {
  using param_t = param_t_;
  using acc_t = acc_t_;
  static constexpr bool kGrads = true, kMaster = kMaster_, kWritesWeights = false;
  static constexpr int kSlots = 2, kInputs = 0, kOutputs = 1, kScalars = 1;

  Stage1Scalars s;

  __device__ const FoundInf& flag() const { return s.found_inf; }

  __device__ GradReader<acc_t> grads() const { return GradReader<acc_t>(s.grad_scale, s.maximize); }

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

struct Stage1Lists {
  at::TensorList params, grads, exp_avgs, exp_avg_sqs, updates, master_params, steps;
};

template <typename param_t, typename acc_t, bool kAdamW, bool kMaster>
void launch_stage1(const Stage1Lists& l, const Stage1Scalars& s) {
  using Op = ElementwiseStep<Stage1Policy<param_t, acc_t, kAdamW, kMaster>>;
  std::vector<at::TensorList> lists{l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, l.updates};
  if constexpr (kMaster) lists.push_back(l.master_params);
  multi_tensor_apply<Op::kDepth, 1>(to_array<Op::kDepth>(lists), {l.steps}, Op{{s}});
}

void fused_lamb_stage1_(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                        at::TensorList exp_avg_sqs, at::TensorList master_params,
                        at::TensorList steps, at::TensorList updates, double beta1, double beta2,
                        double eps, double weight_decay, bool adam_w_mode, bool bias_correction,
                        bool grad_averaging, bool maximize,
                        const std::optional<at::Tensor>& grad_scale,
                        const std::optional<at::Tensor>& found_inf) {
  if (!check_optimizer_group(params, grads, steps, std::nullopt, grad_scale, found_inf)) return;
  check_state_list(params, exp_avgs, "exp_avgs", false);
  check_state_list(params, exp_avg_sqs, "exp_avg_sqs", false);
  check_state_list(params, updates, "updates", false);
  check_masters(params, master_params);
  check_layouts(params, {{exp_avgs, "exp_avgs"}, {exp_avg_sqs, "exp_avg_sqs"},
                         {updates, "updates"}, {master_params, "master_params"}});
  const auto device = params[0].device();
  check_cuda(device);
  const bool is_double = params[0].scalar_type() == at::kDouble;
  const bool master = !master_params.empty();
  const c10::cuda::CUDAGuard guard(device);

  at::Tensor scale_keep;
  const Stage1Scalars s{beta1, beta2, eps, weight_decay, device_scalar_arg(grad_scale, scale_keep),
                        optional_flag(found_inf), bias_correction, grad_averaging, maximize};

  const std::vector<at::Tensor> gs = grads_like_params(params, grads);
  const bool strided = any_strided(params);
  FlatLists flat;
  flat.storage.reserve(6);  // the TensorLists below point into it: no reallocation
  const Stage1Lists lists{flat(params, strided), flat(gs, strided), flat(exp_avgs, strided),
                          flat(exp_avg_sqs, strided), flat(updates, strided),
                          flat(master_params, strided), steps};

  bool_switch(adam_w_mode, [&](auto adamw) {
    if (is_double) {
      launch_stage1<double, double, decltype(adamw)::value, false>(lists, s);
      return;
    }
    bool_switch(master, [&](auto has_master) {
      CORE_OPS_DISPATCH_FLOAT_HALF_BF16(params[0].scalar_type(), "params", param_t,
        (launch_stage1<param_t, float, decltype(adamw)::value, decltype(has_master)::value>(lists, s)));
    });
  });
  if (grad_scale.has_value()) copy_back_grads(grads, gs);  // values the kernel wrote, or the same
  advance_steps(steps, s.found_inf);
}

// ---- stage 2 --------------------------------------------------------------------

struct Stage2Scalars {
  double lr, weight_decay;
  DeviceScalar lr_tensor;
  FoundInf found_inf;
  bool use_nvlamb;
};

// Lists (Note [One functor moves an optimizer's memory]): params, updates (read),
// then master_params when present; two per-tensor scalars after them: the tensor's
// param norm and update norm.
template <typename param_t_, typename acc_t_, bool kMaster_>
struct Stage2Policy {
  using param_t = param_t_;
  using acc_t = acc_t_;
  static constexpr bool kGrads = false, kMaster = kMaster_, kWritesWeights = true;
  static constexpr int kSlots = 0, kInputs = 1, kOutputs = 0, kScalars = 2;

  Stage2Scalars s;

  __device__ const FoundInf& flag() const { return s.found_inf; }

  template <typename Meta>
  __device__ acc_t coeffs(const TensorScalars<Meta>& scalars) const {  // the tensor's step, negated
    return lamb_neg_step<acc_t>(s.lr_tensor.get(s.lr), scalars.template get<acc_t>(0),
                                scalars.template get<acc_t>(1), s.weight_decay, s.use_nvlamb);
  }

  __device__ void math(acc_t& x, acc_t, acc_t (&)[1], const acc_t (&update)[1], acc_t (&)[1],
                       const acc_t& neg_step) const {
    lamb_stage2_math(x, update[0], neg_step);
  }
};

struct Stage2Lists {
  at::TensorList params, updates, master_params, param_norms, update_norms;
};

template <typename param_t, typename acc_t, bool kMaster>
void launch_stage2(const Stage2Lists& l, const Stage2Scalars& s) {
  using Op = ElementwiseStep<Stage2Policy<param_t, acc_t, kMaster>>;
  std::vector<at::TensorList> lists{l.params, l.updates};
  if constexpr (kMaster) lists.push_back(l.master_params);
  multi_tensor_apply<Op::kDepth, 2>(to_array<Op::kDepth>(lists), {l.param_norms, l.update_norms}, Op{{s}});
}

// norms[i] as one-element views of the device tensor: per-tensor scalars of the launch.
std::vector<at::Tensor> per_tensor_views(const at::Tensor& norms) {
  const at::Tensor flat = norms.reshape({norms.numel()});
  std::vector<at::Tensor> out;
  out.reserve(flat.numel());
  for (int64_t i = 0; i < flat.numel(); ++i) out.push_back(flat.select(0, i));
  return out;
}

void fused_lamb_stage2_(at::TensorList params, at::TensorList master_params,
                        at::TensorList updates, const at::Tensor& param_norms,
                        const at::Tensor& update_norms, double lr, double weight_decay,
                        bool use_nvlamb, const std::optional<at::Tensor>& lr_tensor,
                        const std::optional<at::Tensor>& found_inf) {
  if (params.empty()) return;
  const auto device = params[0].device();
  check_list(params, "params", device);
  check_state_list(params, updates, "updates", false);
  check_masters(params, master_params);
  check_layouts(params, {{updates, "updates"}, {master_params, "master_params"}});
  const int64_t n = static_cast<int64_t>(params.size());
  for (const auto* norms : {&param_norms, &update_norms}) {
    TORCH_CHECK_VALUE(norms->numel() == n && norms->device() == device &&
                          norms->scalar_type() == state_dtype(params[0].scalar_type()),
                      "param_norms and update_norms must hold one ",
                      dtype_name(state_dtype(params[0].scalar_type())), " norm per param on ", device);
  }
  if (found_inf.has_value()) check_flag(*found_inf, device);
  if (lr_tensor.has_value()) {
    TORCH_CHECK_VALUE(lr_tensor->numel() == 1 && lr_tensor->device() == device,
                      "lr must be a one-element tensor on ", device);
  }
  check_cuda(device);
  const bool is_double = params[0].scalar_type() == at::kDouble;
  const bool master = !master_params.empty();
  const c10::cuda::CUDAGuard guard(device);

  at::Tensor lr_keep;
  const Stage2Scalars s{lr, weight_decay, device_scalar_arg(lr_tensor, lr_keep),
                        optional_flag(found_inf), use_nvlamb};

  const std::vector<at::Tensor> pn = per_tensor_views(param_norms);
  const std::vector<at::Tensor> un = per_tensor_views(update_norms);
  const bool strided = any_strided(params);
  FlatLists flat;
  flat.storage.reserve(3);  // the TensorLists below point into it: no reallocation
  const Stage2Lists lists{flat(params, strided), flat(updates, strided), flat(master_params, strided),
                          pn, un};

  if (is_double) {
    launch_stage2<double, double, false>(lists, s);
    return;
  }
  bool_switch(master, [&](auto has_master) {
    CORE_OPS_DISPATCH_FLOAT_HALF_BF16(params[0].scalar_type(), "params", param_t,
      (launch_stage2<param_t, float, decltype(has_master)::value>(lists, s)));
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(core_ops, CUDA, m) {
  m.impl("fused_lamb_stage1_", &fused_lamb_stage1_);
  m.impl("fused_lamb_stage2_", &fused_lamb_stage2_);
}

}  // namespace core_ops::cuda
