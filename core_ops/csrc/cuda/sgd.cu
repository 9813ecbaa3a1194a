// CUDA kernel of fused_sgd_: the checks of csrc/cpu/sgd.cpp, the math of
// core_ops/sgd_math.h, and found_inf, lr and grad_scale read on the device so the
// host never waits (Note [Fused optimizer ops] in _library.py). The pattern of
// adam.cu: one multi_tensor_apply pass; SGD keeps no step count, so there is no
// per-tensor scalar and no step-advance kernel. first_step and wd_after_momentum are
// runtime flags of SgdCoeffs, as on the CPU.
#include <array>
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

// Lists, in this order: params, grads, then momentum_buffers (momentum != 0) and
// master_params (master weights) when present.
constexpr int master_idx(bool momentum) { return momentum ? 3 : 2; }
constexpr int sgd_depth(bool momentum, bool master) { return 2 + int(momentum) + int(master); }

template <typename param_t, typename acc_t, bool kMomentum, bool kNesterov, bool kMaster>
struct SgdOp {
  static constexpr int kDepth = sgd_depth(kMomentum, kMaster);
  using Meta = TensorListMeta<kDepth, 0>;

  SgdScalars s;

  __device__ void operator()(const Meta& meta, int t, int64_t begin, int len, int64_t) const {
    if (flag_is_set(s.found_inf)) return;  // a skipped step changes nothing

    const SgdCoeffs<acc_t> c = sgd_coeffs<acc_t>(s.lr_tensor.get(s.lr), s.momentum, s.dampening,
                                                 s.weight_decay, s.first_step, s.wd_after_momentum);
    const GradReader<acc_t> grads(s.grad_scale, s.maximize);
    // Note [Half params without masters]: torch's roundings for a half param alone.
    using Round = std::conditional_t<!kMaster && !std::is_same_v<param_t, acc_t>, RoundTo<param_t>, NoRound>;
    const Round round;

    param_t* p = static_cast<param_t*>(meta.addresses[0][t]) + begin;
    param_t* g = static_cast<param_t*>(meta.addresses[1][t]) + begin;
    acc_t* b = nullptr;  // momentum buffer
    acc_t* w = nullptr;  // master weights
    bool vec = pack_aligned(p) && pack_aligned(g);
    if constexpr (kMomentum) {
      b = static_cast<acc_t*>(meta.addresses[2][t]) + begin;
      vec = vec && pack_aligned(b);
    }
    if constexpr (kMaster) {
      w = static_cast<acc_t*>(meta.addresses[master_idx(kMomentum)][t]) + begin;
      vec = vec && pack_aligned(w);
    }

    for (int i = threadIdx.x * kILP; i < len; i += blockDim.x * kILP) {
      const int n = len - i < kILP ? len - i : kILP;
      acc_t x[kILP], gr[kILP], bf[kILP] = {};
      if constexpr (kMaster) {
        load_pack(x, w + i, n, vec);
      } else {
        load_pack(x, p + i, n, vec);
      }
      grads.load(gr, g + i, n, vec);
      if constexpr (kMomentum) load_pack(bf, b + i, n, vec);
#pragma unroll
      for (int k = 0; k < kILP; ++k) {
        // Padding beyond n is computed on zeros and never stored.
        sgd_math<kMomentum, kNesterov>(x[k], gr[k], bf[k], c, round);
      }
      if constexpr (kMomentum) store_pack(b + i, bf, n, vec);
      if constexpr (kMaster) store_pack(w + i, x, n, vec);
      store_pack(p + i, x, n, vec);
    }
  }
};

struct SgdLists {
  at::TensorList params, grads, momentum_buffers, master_params;
};

template <typename param_t, typename acc_t, bool kMomentum, bool kNesterov, bool kMaster>
void launch_sgd(const SgdLists& l, const SgdScalars& s) {
  using Op = SgdOp<param_t, acc_t, kMomentum, kNesterov, kMaster>;
  std::array<at::TensorList, Op::kDepth> lists;
  lists[0] = l.params;
  lists[1] = l.grads;
  if constexpr (kMomentum) lists[2] = l.momentum_buffers;
  if constexpr (kMaster) lists[master_idx(kMomentum)] = l.master_params;
  multi_tensor_apply<Op::kDepth, 0>(lists, {}, Op{s});
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
