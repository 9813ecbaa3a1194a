// CUDA kernel of fused_sgd_: the checks of csrc/cpu/sgd.cpp, the math of
// core_ops/sgd_math.h, and found_inf, lr and grad_scale read on the device so the
// host never waits (Note [Fused optimizer ops] in _library.py). The pattern of
// adam.cu: one multi_tensor_apply pass; SGD keeps no step count, so there is no
// per-tensor scalar and no step-advance kernel. first_step and wd_after_momentum are
// runtime flags of SgdCoeffs, as on the CPU.
#include <type_traits>
#include <vector>

#include <torch/library.h>

#include <core_ops/dispatch.h>
#include <core_ops/optimizer_args.h>
#include <core_ops/sgd_math.h>

#include "multi_tensor_apply.cuh"
#include "optimizer_step.cuh"

namespace core_ops::cuda {
namespace {

struct SgdScalars {
  double lr, momentum, dampening, weight_decay;
  DeviceScalar lr_tensor, grad_scale;
  FoundInf found_inf;
  bool first_step, wd_after_momentum, maximize;
};

// Lists (Note [One functor moves an optimizer's memory]): params, grads, then
// momentum_buffers (momentum != 0) and master_params (master weights) when present.
template <typename param_t_, typename acc_t_, bool kMomentum, bool kNesterov, bool kMaster_>
struct SgdPolicy {
  using param_t = param_t_;
  using acc_t = acc_t_;
  static constexpr bool kGrads = true, kMaster = kMaster_, kWritesWeights = true;
  static constexpr int kSlots = int(kMomentum), kInputs = 0, kOutputs = 0, kScalars = 0;
  // Note [Half params without masters]: torch's roundings for a half param alone.
  using Round = std::conditional_t<!kMaster && !std::is_same_v<param_t, acc_t>, RoundTo<param_t>, NoRound>;

  SgdScalars s;

  __device__ const FoundInf& flag() const { return s.found_inf; }

  __device__ GradReader<acc_t> grads() const { return GradReader<acc_t>(s.grad_scale, s.maximize); }

  template <typename Meta>
  __device__ SgdCoeffs<acc_t> coeffs(const TensorScalars<Meta>&) const {
    return sgd_coeffs<acc_t>(s.lr_tensor.get(s.lr), s.momentum, s.dampening, s.weight_decay, s.first_step,
                             s.wd_after_momentum);
  }

  __device__ void math(acc_t& x, acc_t g, acc_t (&st)[1], const acc_t (&)[1], acc_t (&)[1],
                       const SgdCoeffs<acc_t>& c) const {
    acc_t none = 0;  // no momentum buffer: sgd_math leaves it alone
    sgd_math<kMomentum, kNesterov>(x, g, kMomentum ? st[0] : none, c, Round());
  }
};

struct SgdLists {
  at::TensorList params, grads, momentum_buffers, master_params;
};

template <typename param_t, typename acc_t, bool kMomentum, bool kNesterov, bool kMaster>
void launch_sgd(const SgdLists& l, const SgdScalars& s) {
  using Op = ElementwiseStep<SgdPolicy<param_t, acc_t, kMomentum, kNesterov, kMaster>>;
  std::vector<at::TensorList> lists{l.params, l.grads};
  if constexpr (kMomentum) lists.push_back(l.momentum_buffers);
  if constexpr (kMaster) lists.push_back(l.master_params);
  multi_tensor_apply<Op::kDepth, 0>(to_array<Op::kDepth>(lists), {}, Op{{s}});
}

void fused_sgd_(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers,
                at::TensorList master_params, double lr, double momentum, double dampening,
                double weight_decay, bool nesterov, bool wd_after_momentum, bool first_step,
                bool maximize, const std::optional<at::Tensor>& lr_tensor,
                const std::optional<at::Tensor>& grad_scale,
                const std::optional<at::Tensor>& found_inf) {
  if (!check_optimizer_group(params, grads, {}, lr_tensor, grad_scale, found_inf,
                             /*has_steps=*/false)) {
    return;
  }
  const bool has_momentum = momentum != 0.0;
  check_state_list(params, momentum_buffers, "momentum_buffers", !has_momentum);
  TORCH_CHECK_VALUE(!has_momentum || !momentum_buffers.empty(), "momentum needs momentum_buffers");
  TORCH_CHECK_VALUE(!nesterov || has_momentum, "nesterov needs momentum > 0");
  check_masters(params, master_params);
  check_layouts(params, {{momentum_buffers, "momentum_buffers"}, {master_params, "master_params"}});
  const auto device = params[0].device();
  check_cuda(device);
  const bool is_double = params[0].scalar_type() == at::kDouble;
  const bool master = !master_params.empty();
  const c10::cuda::CUDAGuard guard(device);

  at::Tensor lr_keep, scale_keep;
  const SgdScalars s{lr, momentum, dampening, weight_decay,
                     device_scalar_arg(lr_tensor, lr_keep), device_scalar_arg(grad_scale, scale_keep),
                     optional_flag(found_inf), first_step, wd_after_momentum, maximize};

  const std::vector<at::Tensor> gs = grads_like_params(params, grads);
  bool strided = false;
  for (const auto& p : params) strided = strided || !p.is_contiguous();
  FlatLists flat;
  flat.storage.reserve(4);  // the TensorLists below point into it: no reallocation
  const SgdLists lists{flat(params, strided), flat(gs, strided),
                       flat(has_momentum ? momentum_buffers : at::TensorList(), strided),
                       flat(master_params, strided)};

  bool_switch(has_momentum, [&](auto mom) {
    bool_switch(nesterov && has_momentum, [&](auto nest) {
      constexpr bool kMom = decltype(mom)::value;
      constexpr bool kNest = decltype(nest)::value && kMom;
      if (is_double) {
        launch_sgd<double, double, kMom, kNest, false>(lists, s);
        return;
      }
      bool_switch(master, [&](auto has_master) {
        CORE_OPS_DISPATCH_FLOAT_HALF_BF16(params[0].scalar_type(), "params", param_t,
          (launch_sgd<param_t, float, kMom, kNest, decltype(has_master)::value>(lists, s)));
      });
    });
  });
  if (grad_scale.has_value()) copy_back_grads(grads, gs);  // values the kernel wrote, or the same
}

}  // namespace

TORCH_LIBRARY_IMPL(core_ops, CUDA, m) {
  m.impl("fused_sgd_", &fused_sgd_);
}

}  // namespace core_ops::cuda
