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

#include <core_ops/dispatch.h>
#include <core_ops/optimizer_args.h>
#include <core_ops/tensor.h>

#include "multi_tensor_apply.cuh"
#include "optimizer_step.cuh"
#include "stream.cuh"

namespace core_ops::cuda {

// norms[i] as one-element views of the device tensor: per-tensor scalars of a launch.
inline std::vector<Tensor> per_tensor_views(const Tensor& norms) {
  const Tensor flat = torch::stable::reshape(norms, {norms.numel()});
  std::vector<Tensor> out;
  out.reserve(flat.numel());
  for (int64_t i = 0; i < flat.numel(); ++i) out.push_back(torch::stable::select(flat, 0, i));
  return out;
}

class OptimizerLaunch {
 public:
  // grads: empty for a step that reads none (LAMB's stage 2).
  OptimizerLaunch(TensorList params, TensorList grads, const OptionalTensor& lr_tensor,
                  const OptionalTensor& grad_scale, const OptionalTensor& found_inf, bool maximize)
      : device_(cuda_device(params)),
        guard_(device_),
        stream_(current_stream(device_)),
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
  void run(const Op& op, std::initializer_list<TensorList> lists, TensorList masters,
           std::vector<TensorList> scalars = {}) {
    std::vector<TensorList> walked{flat(params_)};
    if constexpr (Op::kGrads) walked.push_back(flat(used_grads_));
    for (const TensorList ts : lists) {
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
  void elementwise(MakePolicy&& make_policy, std::initializer_list<TensorList> lists, TensorList masters,
                   std::vector<TensorList> scalars = {}) {
    for_param_types(dtype_of(params_[0]), !masters.empty(), [&](auto param, auto acc, auto has_master) {
      const auto policy = make_policy(param, acc, has_master);
      using Op = ElementwiseStep<decltype(param), decltype(acc), decltype(has_master)::value,
                                 std::decay_t<decltype(policy)>>;
      run(Op{policy}, lists, masters, scalars);
    });
  }

  // After the launches: the grads get the values the kernels wrote (into copies made
  // for their layout, else in place: copy_back_grads skips those), and `steps` (empty
  // for an optimizer without step counts) advance.
  void finish(TensorList steps) {
    if (writes_grads_) copy_back_grads(grads_, used_grads_);
    if (!steps.empty()) advance_steps(steps, step_.found_inf, stream_);
  }

 private:
  static DeviceIndex cuda_device(TensorList params) {
    const Device device = params[0].device();
    check_cuda(device);
    return device.index();
  }

  static bool any_strided(TensorList params) {
    for (const auto& p : params) {
      if (!p.is_contiguous()) return true;
    }
    return false;
  }

  // Note [Optimizer memory layout]: a dense tensor that is not contiguous
  // (channels_last) still fills numel elements from its data pointer, laid out as its
  // param (the checks made sure), so the launch walks a flat alias of it. Contiguous
  // lists, the usual case, are passed as they are: no new tensor per element.
  TensorList flat(TensorList ts) {
    if (!strided_ || ts.empty()) return ts;
    std::vector<Tensor> aliases;
    aliases.reserve(ts.size());
    for (const auto& t : ts) aliases.push_back(t.is_contiguous() ? t : flat_view(t));
    flat_.push_back(std::move(aliases));  // a deque: the lists handed out stay valid
    return flat_.back();
  }

  // t.as_strided({numel}, {1}), made by the AOTI shim (torch::stable has no as_strided):
  // a view sharing t's storage, so nothing about the memory is looked up again.
  static Tensor flat_view(const Tensor& t) {
    const int64_t size = t.numel(), stride = 1;
    AtenTensorHandle view = nullptr;
    const int64_t offset = t.storage_offset();
    STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch__reinterpret_tensor(t.get(), 1, &size, &stride, offset, &view));
    return Tensor(view);
  }

  const DeviceIndex device_;
  const DeviceGuard guard_;
  const cudaStream_t stream_;  // torch's current stream on device_, under the guard
  TensorList params_, grads_;
  std::vector<Tensor> used_grads_;  // grads_ in the params' layout
  bool writes_grads_;
  bool strided_;
  // lr and grad_scale of another dtype, cast for the kernels: held until they are
  // enqueued (the caching allocator orders the memory's reuse after them).
  OptionalTensor lr_keep_, scale_keep_;
  StepScalars step_;
  std::deque<std::vector<Tensor>> flat_;
};

}  // namespace core_ops::cuda
