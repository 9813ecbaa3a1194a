// CUDA kernel of fused_novograd_: the checks of csrc/cpu/novograd.cpp, the math of
// core_ops/novograd_math.h, and found_inf, lr, grad_scale, the grad norms, the
// per-tensor second moments and the step counts kept on the device so the host never
// waits (Note [Fused optimizer ops] in _library.py). The per-tensor grad norms come in
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
#include <type_traits>
#include <vector>

#include <torch/library.h>

#include <core_ops/dispatch.h>
#include <core_ops/novograd_math.h>
#include <core_ops/optimizer_args.h>

#include "multi_tensor_apply.cuh"
#include "optimizer_step.cuh"

namespace core_ops::cuda {
namespace {

struct NovoGradScalars {
  double lr, beta1, beta2, eps, weight_decay;
  DeviceScalar lr_tensor, grad_scale;
  FoundInf found_inf;
  int64_t norm_type;
  bool bias_correction, grad_averaging, init_zero, maximize;
};

// Step 1: the walked list is exp_avg_sqs (one element per tensor, so one block per
// tensor); per-tensor scalars: the step count, then the grad norm.
template <typename acc_t>
struct SecondMomentOp {
  using Meta = TensorListMeta<1, 2>;

  NovoGradScalars s;

  __device__ void operator()(const Meta& meta, int t, int64_t, int, int64_t) const {
    if (threadIdx.x != 0 || flag_is_set(s.found_inf)) return;
    acc_t* v = static_cast<acc_t*>(meta.addresses[0][t]);
    const float step = *static_cast<const float*>(meta.addresses[1][t]) + 1.f;
    const double norm = static_cast<double>(*static_cast<const acc_t*>(meta.addresses[2][t])) /
                        s.grad_scale.get(1.0);
    const bool fresh = step == 1.f && !s.init_zero;
    *v = static_cast<acc_t>(novograd_second_moment(static_cast<double>(*v), norm, s.beta2, fresh,
                                                   s.norm_type));
  }
};

// Step 2. Lists (Note [One functor moves an optimizer's memory]): params, grads,
// exp_avgs, then master_params when present; two per-tensor scalars after them: the
// step count and the (updated) second moment.
template <typename param_t_, typename acc_t_, bool kRegInside, bool kMaster_>
struct NovoGradPolicy {
  using param_t = param_t_;
  using acc_t = acc_t_;
  static constexpr bool kGrads = true, kMaster = kMaster_, kWritesWeights = true;
  static constexpr int kSlots = 1, kInputs = 0, kOutputs = 0, kScalars = 2;

  NovoGradScalars s;

  __device__ const FoundInf& flag() const { return s.found_inf; }

  __device__ GradReader<acc_t> grads() const { return GradReader<acc_t>(s.grad_scale, s.maximize); }

  // v is the stored (rounded) second moment step 1 wrote.
  template <typename Meta>
  __device__ NovoGradCoeffs<acc_t> coeffs(const TensorScalars<Meta>& scalars) const {
    const double v = static_cast<double>(scalars.template get<acc_t>(1));
    return novograd_coeffs<acc_t>(s.lr_tensor.get(s.lr), s.beta1, s.beta2, s.eps, s.weight_decay,
                                  next_step(scalars), v, s.norm_type, s.bias_correction, s.grad_averaging);
  }

  __device__ void math(acc_t& x, acc_t g, acc_t (&st)[1], const acc_t (&)[1], acc_t (&)[1],
                       const NovoGradCoeffs<acc_t>& c) const {
    novograd_math<kRegInside>(x, g, st[0], c);
  }
};

struct NovoGradLists {
  at::TensorList params, grads, exp_avgs, master_params, exp_avg_sqs, steps, grad_norms;
};

template <typename param_t, typename acc_t, bool kRegInside, bool kMaster>
void launch_novograd(const NovoGradLists& l, const NovoGradScalars& s) {
  multi_tensor_apply<1, 2>({l.exp_avg_sqs}, {l.steps, l.grad_norms}, SecondMomentOp<acc_t>{s});
  using Op = ElementwiseStep<NovoGradPolicy<param_t, acc_t, kRegInside, kMaster>>;
  std::vector<at::TensorList> lists{l.params, l.grads, l.exp_avgs};
  if constexpr (kMaster) lists.push_back(l.master_params);
  multi_tensor_apply<Op::kDepth, 2>(to_array<Op::kDepth>(lists), {l.steps, l.exp_avg_sqs}, Op{{s}});
}

// exp_avg_sqs: one one-element state-dtype tensor per param; grad_norms: one norm per
// param (csrc/cpu/novograd.cpp's check).
void check_per_tensor_state(at::TensorList params, at::TensorList exp_avg_sqs,
                            const at::Tensor& grad_norms) {
  check_same_length(params, "params", exp_avg_sqs, "exp_avg_sqs");
  const auto device = params[0].device();
  const auto want = state_dtype(params[0].scalar_type());
  for (size_t i = 0; i < exp_avg_sqs.size(); ++i) {
    TORCH_CHECK_VALUE(exp_avg_sqs[i].numel() == 1 && exp_avg_sqs[i].device() == device &&
                          exp_avg_sqs[i].scalar_type() == want,
                      "exp_avg_sqs[", i, "] must be a one-element ", dtype_name(want),
                      " tensor on ", device);
  }
  TORCH_CHECK_VALUE(grad_norms.numel() == static_cast<int64_t>(params.size()) &&
                        grad_norms.device() == device && grad_norms.scalar_type() == want,
                    "grad_norms must hold one ", dtype_name(want), " norm per param on ", device);
}

// norms[i] as one-element views of the device tensor: per-tensor scalars of a launch.
std::vector<at::Tensor> per_tensor_views(const at::Tensor& norms) {
  const at::Tensor flat = norms.reshape({norms.numel()});
  std::vector<at::Tensor> out;
  out.reserve(flat.numel());
  for (int64_t i = 0; i < flat.numel(); ++i) out.push_back(flat.select(0, i));
  return out;
}

void fused_novograd_(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                     at::TensorList exp_avg_sqs, at::TensorList master_params,
                     at::TensorList steps, const at::Tensor& grad_norms, int64_t norm_type,
                     double lr, double beta1, double beta2, double eps, double weight_decay,
                     bool bias_correction, bool reg_inside_moment, bool grad_averaging,
                     bool init_zero, bool maximize,
                     const std::optional<at::Tensor>& lr_tensor,
                     const std::optional<at::Tensor>& grad_scale,
                     const std::optional<at::Tensor>& found_inf) {
  if (!check_optimizer_group(params, grads, steps, lr_tensor, grad_scale, found_inf)) return;
  check_state_list(params, exp_avgs, "exp_avgs", false);
  check_per_tensor_state(params, exp_avg_sqs, grad_norms);
  check_masters(params, master_params);
  check_layouts(params, {{exp_avgs, "exp_avgs"}, {master_params, "master_params"}});
  TORCH_CHECK_VALUE(norm_type == 0 || norm_type == 2,
                    "norm_type must be 2 (L2) or 0 (infinity norm), got ", norm_type);
  const auto device = params[0].device();
  check_cuda(device);
  const bool is_double = params[0].scalar_type() == at::kDouble;
  const bool master = !master_params.empty();
  const c10::cuda::CUDAGuard guard(device);

  at::Tensor lr_keep, scale_keep;
  const NovoGradScalars s{lr, beta1, beta2, eps, weight_decay,
                          device_scalar_arg(lr_tensor, lr_keep), device_scalar_arg(grad_scale, scale_keep),
                          optional_flag(found_inf), norm_type, bias_correction, grad_averaging,
                          init_zero, maximize};

  const std::vector<at::Tensor> gs = grads_like_params(params, grads);
  const std::vector<at::Tensor> norms = per_tensor_views(grad_norms);
  bool strided = false;
  for (const auto& p : params) strided = strided || !p.is_contiguous();
  FlatLists flat;
  flat.storage.reserve(4);  // the TensorLists below point into it: no reallocation
  const NovoGradLists lists{flat(params, strided), flat(gs, strided), flat(exp_avgs, strided),
                            flat(master_params, strided), exp_avg_sqs, steps, norms};

  bool_switch(reg_inside_moment, [&](auto reg_inside) {
    if (is_double) {
      launch_novograd<double, double, decltype(reg_inside)::value, false>(lists, s);
      return;
    }
    bool_switch(master, [&](auto has_master) {
      CORE_OPS_DISPATCH_FLOAT_HALF_BF16(params[0].scalar_type(), "params", param_t,
        (launch_novograd<param_t, float, decltype(reg_inside)::value, decltype(has_master)::value>(lists, s)));
    });
  });
  if (grad_scale.has_value()) copy_back_grads(grads, gs);  // values the kernel wrote, or the same
  advance_steps(steps, s.found_inf);
}

}  // namespace

TORCH_LIBRARY_IMPL(core_ops, CUDA, m) {
  m.impl("fused_novograd_", &fused_novograd_);
}

}  // namespace core_ops::cuda
