// The host side of every CUDA fused optimizer step, after the checks of
// core_ops/optimizer_ops.h. Note [One launch serves every optimizer]: each step does the
// same host work around its kernels, and OptimizerLaunch does it once:
//   - the device guard, and the optional lr / grad_scale / found_inf as StepScalars
//     the kernels read on the device (so the host never waits);
//   - grads laid out unlike their params copied into the params' layout, and every
//     list walked as a flat alias when a param is dense but not contiguous (Note
//     [Optimizer memory layout]);
//   - the launch: params, grads (when the functor reads them), the optimizer's own
//     lists, the masters (when it has them), then its per-tensor scalars;
//   - afterwards the grads get what the kernels wrote, and the step counts advance
//     once every block has read them.
// An optimizer then writes its math, its functor's policy and the lists it adds.
#pragma once

#include <deque>
#include <initializer_list>
#include <optional>
#include <type_traits>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>

#include <core_ops/dispatch.h>
#include <core_ops/optimizer_args.h>

#include "multi_tensor_apply.cuh"
#include "optimizer_step.cuh"

namespace core_ops::cuda {

// norms[i] as one-element views of the device tensor: per-tensor scalars of a launch.
inline std::vector<at::Tensor> per_tensor_views(const at::Tensor& norms) {
  const at::Tensor flat = norms.reshape({norms.numel()});
  std::vector<at::Tensor> out;
  out.reserve(flat.numel());
  for (int64_t i = 0; i < flat.numel(); ++i) out.push_back(flat.select(0, i));
  return out;
}

class OptimizerLaunch {
 public:
  // grads: empty for a step that reads none (LAMB's stage 2).
  OptimizerLaunch(at::TensorList params, at::TensorList grads, const std::optional<at::Tensor>& lr_tensor,
                  const std::optional<at::Tensor>& grad_scale, const std::optional<at::Tensor>& found_inf,
                  bool maximize)
      : guard_(cuda_device(params)),
        params_(params),
        grads_(grads),
        used_grads_(grads_like_params(params, grads)),
        writes_grads_(grad_scale.has_value()),
        strided_(any_strided(params)) {
    step_ = {device_scalar_arg(lr_tensor, lr_keep_), device_scalar_arg(grad_scale, scale_keep_),
             optional_flag(found_inf), maximize};
  }

  const StepScalars& step() const { return step_; }

  // Launches op (a functor of multi_tensor_apply declaring kGrads, kMaster, kDepth and
  // kScalars) over params, grads when kGrads, `lists` in the functor's order (an absent
  // optional list passed empty is left out), masters when kMaster, then the per-tensor
  // scalars (one-element tensors, passed as they are).
  template <typename Op>
  void run(const Op& op, std::initializer_list<at::TensorList> lists, at::TensorList masters,
           std::vector<at::TensorList> scalars = {}) {
    std::vector<at::TensorList> walked{flat(params_)};
    if constexpr (Op::kGrads) walked.push_back(flat(used_grads_));
    for (const at::TensorList ts : lists) {
      if (!ts.empty()) walked.push_back(flat(ts));
    }
    if constexpr (Op::kMaster) walked.push_back(flat(masters));
    multi_tensor_apply<Op::kDepth, Op::kScalars>(to_array<Op::kDepth>(walked), to_array<Op::kScalars>(scalars),
                                                 op);
  }

  // run with ElementwiseStep<Policy> for the params' dtype: make_policy(param_t{},
  // acc_t{}, has_master) returns the Policy (Note [One functor moves an optimizer's
  // memory]), has_master a std::bool_constant.
  template <typename MakePolicy>
  void elementwise(MakePolicy&& make_policy, std::initializer_list<at::TensorList> lists, at::TensorList masters,
                   std::vector<at::TensorList> scalars = {}) {
    for_param_types(params_[0].scalar_type(), !masters.empty(), [&](auto param, auto acc, auto has_master) {
      const auto policy = make_policy(param, acc, has_master);
      using Op = ElementwiseStep<decltype(param), decltype(acc), decltype(has_master)::value,
                                 std::decay_t<decltype(policy)>>;
      run(Op{policy}, lists, masters, scalars);
    });
  }

  // After the launches: the grads get the values the kernels wrote (into copies made
  // for their layout, else in place: copy_back_grads skips those), and `steps` (empty
  // for an optimizer without step counts) advance.
  void finish(at::TensorList steps) {
    if (writes_grads_) copy_back_grads(grads_, used_grads_);
    if (!steps.empty()) advance_steps(steps, step_.found_inf);
  }

 private:
  static c10::Device cuda_device(at::TensorList params) {
    check_cuda(params[0].device());
    return params[0].device();
  }

  static bool any_strided(at::TensorList params) {
    for (const auto& p : params) {
      if (!p.is_contiguous()) return true;
    }
    return false;
  }

  // Note [Optimizer memory layout]: a dense tensor that is not contiguous
  // (channels_last) still fills numel elements from its data pointer, laid out as its
  // param (the checks made sure), so the launch walks a flat alias of it. Contiguous
  // lists, the usual case, are passed as they are: no new tensor per element.
  at::TensorList flat(at::TensorList ts) {
    if (!strided_ || ts.empty()) return ts;
    std::vector<at::Tensor> aliases;
    aliases.reserve(ts.size());
    for (const auto& t : ts) aliases.push_back(t.is_contiguous() ? t : t.as_strided({t.numel()}, {1}));
    flat_.push_back(std::move(aliases));  // a deque: the lists handed out stay valid
    return flat_.back();
  }

  const c10::cuda::CUDAGuard guard_;
  at::TensorList params_, grads_;
  std::vector<at::Tensor> used_grads_;  // grads_ in the params' layout
  bool writes_grads_;
  bool strided_;
  // lr and grad_scale of another dtype, cast for the kernels: held until they are
  // enqueued (the caching allocator orders the memory's reuse after them).
  at::Tensor lr_keep_, scale_keep_;
  StepScalars step_;
  std::deque<std::vector<at::Tensor>> flat_;
};

}  // namespace core_ops::cuda
