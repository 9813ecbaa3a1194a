// CUDA kernel of fused_adagrad_: the checks of csrc/cpu/adagrad.cpp, the math of
// core_ops/adagrad_math.h, and found_inf, lr, grad_scale and the step counts kept on
// the device so the host never waits (Note [Fused optimizer ops] in _library.py).
//
// The pattern of adam.cu: one multi_tensor_apply pass, the step counts riding along
// as per-tensor scalars of the launch descriptor; each block derives its tensor's
// coefficients from that count + 1 (the step this update makes), and a second,
// stream-ordered kernel advances the counts once every block has read them.
#include <type_traits>
#include <vector>

#include <torch/library.h>

#include <core_ops/adagrad_math.h>
#include <core_ops/dispatch.h>
#include <core_ops/optimizer_args.h>

#include "multi_tensor_apply.cuh"
#include "optimizer_step.cuh"

namespace core_ops::cuda {
namespace {

struct AdagradScalars {
  double lr, lr_decay, eps, weight_decay;
  DeviceScalar lr_tensor, grad_scale;
  FoundInf found_inf;
  bool maximize;
};

// Lists (Note [One functor moves an optimizer's memory]): params, grads, state_sums,
// then master_params when present; one per-tensor scalar, the step count, after them.
template <typename param_t_, typename acc_t_, bool kWMode, bool kMaster_>
struct AdagradPolicy {
  using param_t = param_t_;
  using acc_t = acc_t_;
  static constexpr bool kGrads = true, kMaster = kMaster_, kWritesWeights = true;
  static constexpr int kSlots = 1, kInputs = 0, kOutputs = 0, kScalars = 1;

  AdagradScalars s;

  __device__ const FoundInf& flag() const { return s.found_inf; }

  __device__ GradReader<acc_t> grads() const { return GradReader<acc_t>(s.grad_scale, s.maximize); }

  template <typename Meta>
  __device__ AdagradCoeffs<acc_t> coeffs(const TensorScalars<Meta>& scalars) const {
    return adagrad_coeffs<acc_t>(s.lr_tensor.get(s.lr), s.lr_decay, s.eps, s.weight_decay, next_step(scalars));
  }

  __device__ void math(acc_t& x, acc_t g, acc_t (&st)[1], const acc_t (&)[1], acc_t (&)[1],
                       const AdagradCoeffs<acc_t>& c) const {
    adagrad_math<kWMode>(x, g, st[0], c);
  }
};

struct AdagradLists {
  at::TensorList params, grads, state_sums, master_params, steps;
};

template <typename param_t, typename acc_t, bool kWMode, bool kMaster>
void launch_adagrad(const AdagradLists& l, const AdagradScalars& s) {
  using Op = ElementwiseStep<AdagradPolicy<param_t, acc_t, kWMode, kMaster>>;
  std::vector<at::TensorList> lists{l.params, l.grads, l.state_sums};
  if constexpr (kMaster) lists.push_back(l.master_params);
  multi_tensor_apply<Op::kDepth, 1>(to_array<Op::kDepth>(lists), {l.steps}, Op{{s}});
}

void fused_adagrad_(at::TensorList params, at::TensorList grads, at::TensorList state_sums,
                    at::TensorList master_params, at::TensorList steps, double lr,
                    double lr_decay, double eps, double weight_decay, bool adagrad_w_mode,
                    bool maximize, const std::optional<at::Tensor>& lr_tensor,
                    const std::optional<at::Tensor>& grad_scale,
                    const std::optional<at::Tensor>& found_inf) {
  if (!check_optimizer_group(params, grads, steps, lr_tensor, grad_scale, found_inf)) return;
  check_state_list(params, state_sums, "state_sums", false);
  check_masters(params, master_params);
  check_layouts(params, {{state_sums, "state_sums"}, {master_params, "master_params"}});
  const auto device = params[0].device();
  check_cuda(device);
  const bool is_double = params[0].scalar_type() == at::kDouble;
  const bool master = !master_params.empty();
  const c10::cuda::CUDAGuard guard(device);

  at::Tensor lr_keep, scale_keep;
  const AdagradScalars s{lr, lr_decay, eps, weight_decay,
                         device_scalar_arg(lr_tensor, lr_keep), device_scalar_arg(grad_scale, scale_keep),
                         optional_flag(found_inf), maximize};

  const std::vector<at::Tensor> gs = grads_like_params(params, grads);
  bool strided = false;
  for (const auto& p : params) strided = strided || !p.is_contiguous();
  FlatLists flat;
  flat.storage.reserve(4);  // the TensorLists below point into it: no reallocation
  const AdagradLists lists{flat(params, strided), flat(gs, strided), flat(state_sums, strided),
                           flat(master_params, strided), steps};

  bool_switch(adagrad_w_mode, [&](auto wmode) {
    if (is_double) {
      launch_adagrad<double, double, decltype(wmode)::value, false>(lists, s);
      return;
    }
    bool_switch(master, [&](auto has_master) {
      CORE_OPS_DISPATCH_FLOAT_HALF_BF16(params[0].scalar_type(), "params", param_t,
        (launch_adagrad<param_t, float, decltype(wmode)::value, decltype(has_master)::value>(lists, s)));
    });
  });
  if (grad_scale.has_value()) copy_back_grads(grads, gs);  // values the kernel wrote, or the same
  advance_steps(steps, s.found_inf);
}

}  // namespace

TORCH_LIBRARY_IMPL(core_ops, CUDA, m) {
  m.impl("fused_adagrad_", &fused_adagrad_);
}

}  // namespace core_ops::cuda
