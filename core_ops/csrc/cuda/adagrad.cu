// CUDA kernel of fused_adagrad_: the checks of csrc/cpu/adagrad.cpp, the math of
// core_ops/adagrad_math.h, and found_inf, lr, grad_scale and the step counts kept on
// the device so the host never waits (Note [Fused optimizer ops] in _library.py).
//
// The pattern of adam.cu: one multi_tensor_apply pass, the step counts riding along
// as per-tensor scalars of the launch descriptor; each block derives its tensor's
// coefficients from that count + 1 (the step this update makes), and a second,
// stream-ordered kernel advances the counts once every block has read them.
#include <array>
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

// Lists, in this order: params, grads, state_sums, then master_params when present;
// one per-tensor scalar, the step count, after them.
constexpr int kMasterIdx = 3;
constexpr int adagrad_depth(bool master) { return 3 + int(master); }

template <typename param_t, typename acc_t, bool kWMode, bool kMaster>
struct AdagradOp {
  static constexpr int kDepth = adagrad_depth(kMaster);
  using Meta = TensorListMeta<kDepth, 1>;

  AdagradScalars s;

  __device__ void operator()(const Meta& meta, int t, int64_t begin, int len, int64_t) const {
    if (flag_is_set(s.found_inf)) return;  // a skipped step changes nothing

    // The new count is rounded in float, as the CPU kernel's `*step += 1.f`.
    const float step = *static_cast<const float*>(meta.addresses[kDepth][t]) + 1.f;
    const AdagradCoeffs<acc_t> c = adagrad_coeffs<acc_t>(s.lr_tensor.get(s.lr), s.lr_decay, s.eps,
                                                         s.weight_decay, static_cast<double>(step));
    const GradReader<acc_t> grads(s.grad_scale, s.maximize);

    param_t* p = static_cast<param_t*>(meta.addresses[0][t]) + begin;
    param_t* g = static_cast<param_t*>(meta.addresses[1][t]) + begin;
    acc_t* sum = static_cast<acc_t*>(meta.addresses[2][t]) + begin;
    acc_t* w = nullptr;  // master weights
    bool vec = pack_aligned(p) && pack_aligned(g) && pack_aligned(sum);
    if constexpr (kMaster) {
      w = static_cast<acc_t*>(meta.addresses[kMasterIdx][t]) + begin;
      vec = vec && pack_aligned(w);
    }

    for (int i = threadIdx.x * kILP; i < len; i += blockDim.x * kILP) {
      const int n = len - i < kILP ? len - i : kILP;
      acc_t x[kILP], gr[kILP], ss[kILP];
      if constexpr (kMaster) {
        load_pack(x, w + i, n, vec);
      } else {
        load_pack(x, p + i, n, vec);
      }
      grads.load(gr, g + i, n, vec);
      load_pack(ss, sum + i, n, vec);
#pragma unroll
      for (int k = 0; k < kILP; ++k) {
        // Padding beyond n is computed on zeros and never stored.
        adagrad_math<kWMode>(x[k], gr[k], ss[k], c);
      }
      store_pack(sum + i, ss, n, vec);
      if constexpr (kMaster) store_pack(w + i, x, n, vec);
      store_pack(p + i, x, n, vec);
    }
  }
};

struct AdagradLists {
  at::TensorList params, grads, state_sums, master_params, steps;
};

template <typename param_t, typename acc_t, bool kWMode, bool kMaster>
void launch_adagrad(const AdagradLists& l, const AdagradScalars& s) {
  using Op = AdagradOp<param_t, acc_t, kWMode, kMaster>;
  std::array<at::TensorList, Op::kDepth> lists;
  lists[0] = l.params;
  lists[1] = l.grads;
  lists[2] = l.state_sums;
  if constexpr (kMaster) lists[kMasterIdx] = l.master_params;
  multi_tensor_apply<Op::kDepth, 1>(lists, {l.steps}, Op{s});
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
