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
#include <array>
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

// Lists, in this order: params, grads, exp_avgs, exp_avg_sqs, updates, then
// master_params when present; one per-tensor scalar, the step count, after them.
constexpr int kStage1MasterIdx = 5;
constexpr int stage1_depth(bool master) { return 5 + int(master); }

template <typename param_t, typename acc_t, bool kAdamW, bool kMaster>
struct LambStage1Op {
  static constexpr int kDepth = stage1_depth(kMaster);
  using Meta = TensorListMeta<kDepth, 1>;

  Stage1Scalars s;

  __device__ void operator()(const Meta& meta, int t, int64_t begin, int len, int64_t) const {
    if (flag_is_set(s.found_inf)) return;  // a skipped step changes nothing

    // The new count is rounded in float, as the CPU kernel's `*step += 1.f`.
    const float step = *static_cast<const float*>(meta.addresses[kDepth][t]) + 1.f;
    const LambCoeffs<acc_t> c = lamb_coeffs<acc_t>(s.beta1, s.beta2, s.eps, s.weight_decay,
                                                   static_cast<double>(step), s.bias_correction,
                                                   s.grad_averaging);
    const GradReader<acc_t> grads(s.grad_scale, s.maximize);

    const param_t* p = static_cast<const param_t*>(meta.addresses[0][t]) + begin;
    param_t* g = static_cast<param_t*>(meta.addresses[1][t]) + begin;
    acc_t* m = static_cast<acc_t*>(meta.addresses[2][t]) + begin;
    acc_t* v = static_cast<acc_t*>(meta.addresses[3][t]) + begin;
    acc_t* u = static_cast<acc_t*>(meta.addresses[4][t]) + begin;
    const acc_t* w = nullptr;  // master weights
    bool vec = pack_aligned(p) && pack_aligned(g) && pack_aligned(m) && pack_aligned(v) &&
               pack_aligned(u);
    if constexpr (kMaster) {
      w = static_cast<const acc_t*>(meta.addresses[kStage1MasterIdx][t]) + begin;
      vec = vec && pack_aligned(w);
    }

    for (int i = threadIdx.x * kILP; i < len; i += blockDim.x * kILP) {
      const int n = len - i < kILP ? len - i : kILP;
      acc_t x[kILP], gr[kILP], ea[kILP], eas[kILP], up[kILP];
      if constexpr (kMaster) {
        load_pack(x, w + i, n, vec);
      } else {
        load_pack(x, p + i, n, vec);
      }
      grads.load(gr, g + i, n, vec);
      load_pack(ea, m + i, n, vec);
      load_pack(eas, v + i, n, vec);
#pragma unroll
      for (int k = 0; k < kILP; ++k) {
        // Padding beyond n is computed on zeros and never stored.
        up[k] = lamb_stage1_math<kAdamW>(x[k], gr[k], ea[k], eas[k], c);
      }
      store_pack(m + i, ea, n, vec);
      store_pack(v + i, eas, n, vec);
      store_pack(u + i, up, n, vec);
    }
  }
};

struct Stage1Lists {
  at::TensorList params, grads, exp_avgs, exp_avg_sqs, updates, master_params, steps;
};

template <typename param_t, typename acc_t, bool kAdamW, bool kMaster>
void launch_stage1(const Stage1Lists& l, const Stage1Scalars& s) {
  using Op = LambStage1Op<param_t, acc_t, kAdamW, kMaster>;
  std::array<at::TensorList, Op::kDepth> lists;
  lists[0] = l.params;
  lists[1] = l.grads;
  lists[2] = l.exp_avgs;
  lists[3] = l.exp_avg_sqs;
  lists[4] = l.updates;
  if constexpr (kMaster) lists[kStage1MasterIdx] = l.master_params;
  multi_tensor_apply<Op::kDepth, 1>(lists, {l.steps}, Op{s});
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

// Lists, in this order: params, updates, then master_params when present; two
// per-tensor scalars after them: the tensor's param norm and update norm.
constexpr int kStage2MasterIdx = 2;
constexpr int stage2_depth(bool master) { return 2 + int(master); }

template <typename param_t, typename acc_t, bool kMaster>
struct LambStage2Op {
  static constexpr int kDepth = stage2_depth(kMaster);
  using Meta = TensorListMeta<kDepth, 2>;

  Stage2Scalars s;

  __device__ void operator()(const Meta& meta, int t, int64_t begin, int len, int64_t) const {
    if (flag_is_set(s.found_inf)) return;  // a skipped step changes nothing

    const acc_t param_norm = *static_cast<const acc_t*>(meta.addresses[kDepth][t]);
    const acc_t update_norm = *static_cast<const acc_t*>(meta.addresses[kDepth + 1][t]);
    const acc_t neg_step = lamb_neg_step<acc_t>(s.lr_tensor.get(s.lr), param_norm, update_norm,
                                                s.weight_decay, s.use_nvlamb);

    param_t* p = static_cast<param_t*>(meta.addresses[0][t]) + begin;
    const acc_t* u = static_cast<const acc_t*>(meta.addresses[1][t]) + begin;
    acc_t* w = nullptr;  // master weights
    bool vec = pack_aligned(p) && pack_aligned(u);
    if constexpr (kMaster) {
      w = static_cast<acc_t*>(meta.addresses[kStage2MasterIdx][t]) + begin;
      vec = vec && pack_aligned(w);
    }

    for (int i = threadIdx.x * kILP; i < len; i += blockDim.x * kILP) {
      const int n = len - i < kILP ? len - i : kILP;
      acc_t x[kILP], up[kILP];
      if constexpr (kMaster) {
        load_pack(x, w + i, n, vec);
      } else {
        load_pack(x, p + i, n, vec);
      }
      load_pack(up, u + i, n, vec);
#pragma unroll
      for (int k = 0; k < kILP; ++k) lamb_stage2_math(x[k], up[k], neg_step);
      if constexpr (kMaster) store_pack(w + i, x, n, vec);
      store_pack(p + i, x, n, vec);
    }
  }
};

struct Stage2Lists {
  at::TensorList params, updates, master_params, param_norms, update_norms;
};

template <typename param_t, typename acc_t, bool kMaster>
void launch_stage2(const Stage2Lists& l, const Stage2Scalars& s) {
  using Op = LambStage2Op<param_t, acc_t, kMaster>;
  std::array<at::TensorList, Op::kDepth> lists;
  lists[0] = l.params;
  lists[1] = l.updates;
  if constexpr (kMaster) lists[kStage2MasterIdx] = l.master_params;
  multi_tensor_apply<Op::kDepth, 2>(lists, {l.param_norms, l.update_norms}, Op{s});
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
