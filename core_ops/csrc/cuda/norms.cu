// CUDA kernels of the layer-norm and RMS-norm ops (Note [Norm ops] in _library.py): the
// checks of core_ops/norm_args.h, the math of core_ops/norm_math.h.
//
// Note [CUDA norm kernels]: forward and the input's grad give each row one block; its
// threads read the row in packs of 16 bytes (when the row allows: its length a multiple
// of the pack and the pointers aligned, else one value at a time), reduce with warp
// shuffles and one shared-memory step, and read the row again for the next pass (from
// L2: a row is at most a few hundred KB). Forward: sum, centered squares, output.
// Input's grad: the two row sums of g = dy * w and g * xhat, then dx. Weight and bias
// grads are a second kernel over columns: a block owns 32 adjacent columns (coalesced
// reads) and 8 row groups, each thread sums its rows in registers and the 8 groups are
// added in a fixed order: no atomics, the same result every run. The flags (RMS,
// memory_efficient, affine) are uniform over a launch, so their branches cost nothing
// and are not template parameters (fewer kernels to compile).
#include <algorithm>
#include <tuple>
#include <type_traits>

#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <core_ops/norm_args.h>
#include <core_ops/norm_math.h>

namespace core_ops::cuda::norms {
namespace {

template <typename T>
using acc_of = std::conditional_t<std::is_same_v<T, double>, double, float>;

constexpr int kMaxThreads = 512;
constexpr int kColTile = 32, kRowGroups = 8;

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

template <int N, typename T>
__device__ __forceinline__ Pack<T, N> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, N>*>(p);
}

// The sum of v over the block, in every thread. shared holds 32 values.
template <typename T>
__device__ T block_sum(T v, T* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // the previous call's readers are done with shared
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T total = lane < int(blockDim.x / 32) ? shared[lane] : T(0);
  for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
  return total;
}

template <typename acc_t, typename T>
__device__ __forceinline__ acc_t xhat_of(T v, int64_t j, const acc_t* w, const acc_t* b, acc_t mean, acc_t rstd,
                                         bool rms, bool from_out, bool affine) {
  const acc_t a = static_cast<acc_t>(v);
  if (from_out) {
    if (!affine) return a;
    return rms ? a / w[j] : layer_norm_xhat_from_out(a, w[j], b[j]);
  }
  return rms ? a * rstd : (a - mean) * rstd;
}

template <int N, typename in_t, typename out_t, typename acc_t>
__global__ void norm_fwd_kernel(const in_t* __restrict__ x, out_t* __restrict__ y, const acc_t* __restrict__ w,
                                const acc_t* __restrict__ b, acc_t* __restrict__ mean_out,
                                acc_t* __restrict__ rstd_out, int64_t n, acc_t eps, bool rms) {
  __shared__ acc_t shared[32];
  const int64_t row = blockIdx.x;
  const in_t* xr = x + row * n;
  out_t* yr = y + row * n;
  const int64_t step = int64_t(blockDim.x) * N;
  acc_t mean = 0;
  if (!rms) {
    acc_t s = 0;
    for (int64_t j = int64_t(threadIdx.x) * N; j < n; j += step) {
      const auto p = load_pack<N>(xr + j);
#pragma unroll
      for (int k = 0; k < N; ++k) s += static_cast<acc_t>(p.v[k]);
    }
    mean = block_sum(s, shared) / acc_t(n);
  }
  acc_t q = 0;
  for (int64_t j = int64_t(threadIdx.x) * N; j < n; j += step) {
    const auto p = load_pack<N>(xr + j);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const acc_t d = static_cast<acc_t>(p.v[k]) - mean;
      q += d * d;
    }
  }
  const acc_t rstd = acc_t(1) / sqrt(block_sum(q, shared) / acc_t(n) + eps);
  if (threadIdx.x == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
  for (int64_t j = int64_t(threadIdx.x) * N; j < n; j += step) {
    const auto p = load_pack<N>(xr + j);
    Pack<out_t, N> o;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const acc_t v = static_cast<acc_t>(p.v[k]);
      o.v[k] = static_cast<out_t>(rms ? rms_norm_out(v, rstd, w[j + k])
                                      : layer_norm_out(v, mean, rstd, w[j + k], b[j + k]));
    }
    *reinterpret_cast<Pack<out_t, N>*>(yr + j) = o;
  }
}

template <int N, typename in_t, typename out_t, typename saved_t, typename acc_t>
__global__ void norm_bwd_dx_kernel(const out_t* __restrict__ dy, const saved_t* __restrict__ s, in_t* __restrict__ dx,
                                   const acc_t* __restrict__ w, const acc_t* __restrict__ b,
                                   const acc_t* __restrict__ mean, const acc_t* __restrict__ rstd, int64_t n,
                                   bool rms, bool from_out, bool affine) {
  __shared__ acc_t shared[32];
  const int64_t row = blockIdx.x;
  const out_t* dyr = dy + row * n;
  const saved_t* sr = s + row * n;
  in_t* dxr = dx + row * n;
  const acc_t m = rms ? acc_t(0) : mean[row], r = rstd[row];
  const int64_t step = int64_t(blockDim.x) * N;
  acc_t sg = 0, sgx = 0;
  for (int64_t j = int64_t(threadIdx.x) * N; j < n; j += step) {
    const auto d = load_pack<N>(dyr + j);
    const auto v = load_pack<N>(sr + j);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const acc_t g = static_cast<acc_t>(d.v[k]) * w[j + k];
      sg += g;
      sgx += g * xhat_of<acc_t>(v.v[k], j + k, w, b, m, r, rms, from_out, affine);
    }
  }
  const acc_t inv_n = acc_t(1) / acc_t(n);
  const acc_t mean_g = rms ? acc_t(0) : block_sum(sg, shared) * inv_n;
  const acc_t mean_gx = block_sum(sgx, shared) * inv_n;
  for (int64_t j = int64_t(threadIdx.x) * N; j < n; j += step) {
    const auto d = load_pack<N>(dyr + j);
    const auto v = load_pack<N>(sr + j);
    Pack<in_t, N> o;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const acc_t xh = xhat_of<acc_t>(v.v[k], j + k, w, b, m, r, rms, from_out, affine);
      o.v[k] = static_cast<in_t>(layer_norm_dx(static_cast<acc_t>(d.v[k]) * w[j + k], xh, r, mean_g, mean_gx));
    }
    *reinterpret_cast<Pack<in_t, N>*>(dxr + j) = o;
  }
}

template <typename out_t, typename saved_t, typename acc_t>
__global__ void norm_bwd_dw_kernel(const out_t* __restrict__ dy, const saved_t* __restrict__ s,
                                   const acc_t* __restrict__ w, const acc_t* __restrict__ b,
                                   const acc_t* __restrict__ mean, const acc_t* __restrict__ rstd, int64_t rows,
                                   int64_t n, bool rms, bool from_out, bool affine, acc_t* __restrict__ dw,
                                   acc_t* __restrict__ db) {
  __shared__ acc_t sw[kRowGroups][kColTile + 1], sb[kRowGroups][kColTile + 1];
  const int64_t j = int64_t(blockIdx.x) * kColTile + threadIdx.x;
  acc_t aw = 0, ab = 0;
  if (j < n) {
    for (int64_t r = threadIdx.y; r < rows; r += kRowGroups) {
      const acc_t d = static_cast<acc_t>(dy[r * n + j]);
      aw += d * xhat_of<acc_t>(s[r * n + j], j, w, b, rms ? acc_t(0) : mean[r], rstd[r], rms, from_out, affine);
      ab += d;
    }
  }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && j < n) {
    acc_t tw = 0, tb = 0;
    for (int g = 0; g < kRowGroups; ++g) {  // a fixed order
      tw += sw[g][threadIdx.x];
      tb += sb[g][threadIdx.x];
    }
    dw[j] = tw;
    db[j] = tb;
  }
}

// fused_add_rms_norm: h = x + r (rounded to in_t, as stored) and its squares in one read
// of x and r; then y from h, read back from L2.
template <int N, typename in_t, typename acc_t>
__global__ void add_rms_fwd_kernel(const in_t* __restrict__ x, const in_t* __restrict__ r, in_t* __restrict__ h,
                                   in_t* __restrict__ y, const acc_t* __restrict__ w, acc_t* __restrict__ rstd_out,
                                   int64_t n, acc_t eps) {
  __shared__ acc_t shared[32];
  const int64_t o = int64_t(blockIdx.x) * n;
  const int64_t step = int64_t(blockDim.x) * N;
  acc_t q = 0;
  for (int64_t j = int64_t(threadIdx.x) * N; j < n; j += step) {
    const auto a = load_pack<N>(x + o + j);
    const auto b = load_pack<N>(r + o + j);
    Pack<in_t, N> s;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      s.v[k] = static_cast<in_t>(static_cast<acc_t>(a.v[k]) + static_cast<acc_t>(b.v[k]));
      const acc_t v = static_cast<acc_t>(s.v[k]);
      q += v * v;
    }
    *reinterpret_cast<Pack<in_t, N>*>(h + o + j) = s;
  }
  const acc_t rstd = acc_t(1) / sqrt(block_sum(q, shared) / acc_t(n) + eps);
  if (threadIdx.x == 0) rstd_out[blockIdx.x] = rstd;
  for (int64_t j = int64_t(threadIdx.x) * N; j < n; j += step) {
    const auto s = load_pack<N>(h + o + j);  // this thread's own writes
    Pack<in_t, N> out;
#pragma unroll
    for (int k = 0; k < N; ++k) out.v[k] = static_cast<in_t>(rms_norm_out(static_cast<acc_t>(s.v[k]), rstd, w[j + k]));
    *reinterpret_cast<Pack<in_t, N>*>(y + o + j) = out;
  }
}

bool aligned(const void* p, int bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

int threads_for(int64_t n, int pack) {
  const int64_t want = (n / pack + 31) / 32 * 32;
  return static_cast<int>(std::clamp<int64_t>(want, 32, kMaxThreads));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_fwd(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                                        const std::optional<at::Tensor>& bias, int64_t hidden, double eps,
                                                        std::optional<at::ScalarType> out_dtype, bool rms) {
  // Arguments checked by the op's entry point (norm_args.h layer_norm_fwd / rms_norm_fwd).
  const c10::cuda::CUDAGuard guard(input.device());
  const at::Tensor x = input.contiguous();
  const int64_t rows = x.numel() / hidden;
  const at::ScalarType in = x.scalar_type(), out_type = out_dtype.value_or(in);
  const at::ScalarType acc = in == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor out = at::empty(input.sizes(), x.options().dtype(out_type));
  at::Tensor mean = at::empty({rows}, x.options().dtype(acc)), rstd = at::empty({rows}, x.options().dtype(acc));
  if (rows == 0) return {out, mean, rstd};
  const at::Tensor w = acc_param(weight, hidden, acc, 1, x), b = acc_param(bias, hidden, acc, 0, x);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, in, "core_ops norm forward (CUDA)", [&] {
    using in_t = scalar_t;
    using acc_t = acc_of<in_t>;
    constexpr int N = 16 / sizeof(in_t);
    const auto launch = [&](auto* y) {
      using out_t = std::remove_pointer_t<decltype(y)>;
      const bool vec = hidden % N == 0 && aligned(x.const_data_ptr(), 16) && aligned(y, sizeof(out_t) * N);
      const int threads = threads_for(hidden, vec ? N : 1);
      if (vec) {
        norm_fwd_kernel<N><<<rows, threads, 0, stream>>>(x.const_data_ptr<in_t>(), y, w.const_data_ptr<acc_t>(),
            b.const_data_ptr<acc_t>(), mean.data_ptr<acc_t>(), rstd.data_ptr<acc_t>(), hidden, acc_t(eps), rms);
      } else {
        norm_fwd_kernel<1><<<rows, threads, 0, stream>>>(x.const_data_ptr<in_t>(), y, w.const_data_ptr<acc_t>(),
            b.const_data_ptr<acc_t>(), mean.data_ptr<acc_t>(), rstd.data_ptr<acc_t>(), hidden, acc_t(eps), rms);
      }
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    if (out_type == in) {
      launch(out.data_ptr<in_t>());
    } else {
      launch(out.data_ptr<float>());
    }
  });
  return {out, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_bwd(const at::Tensor& grad_out, const at::Tensor& saved,
                                                        const at::Tensor& mean, const at::Tensor& rstd,
                                                        const std::optional<at::Tensor>& weight,
                                                        const std::optional<at::Tensor>& bias, int64_t hidden,
                                                        bool memory_efficient, at::ScalarType dx_dtype, bool rms) {
  // Arguments checked by the op's entry point (norm_args.h layer_norm_bwd / rms_norm_bwd).
  const c10::cuda::CUDAGuard guard(saved.device());
  const at::Tensor dy = grad_out.contiguous(), s = saved.contiguous();
  const int64_t rows = s.numel() / hidden;
  const at::ScalarType acc = dx_dtype == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor dx = at::empty(saved.sizes(), s.options().dtype(dx_dtype));
  const at::Tensor w = acc_param(weight, hidden, acc, 1, s), b = acc_param(bias, hidden, acc, 0, s);
  at::Tensor dw = at::zeros({hidden}, s.options().dtype(acc)), db = at::zeros({hidden}, s.options().dtype(acc));
  const at::Tensor m = (rms ? rstd : mean).contiguous(), r = rstd.contiguous();
  const bool affine = weight.has_value();
  const at::ScalarType out_type = dy.scalar_type();
  TORCH_CHECK_TYPE(out_type == dx_dtype || (out_type == at::kFloat && dx_dtype != at::kDouble),
                   "grad_out must be the input's dtype or, for half input, torch.float32; got ", dtype_name(out_type));
  TORCH_CHECK_TYPE(s.scalar_type() == (memory_efficient ? out_type : dx_dtype), "saved must be the ",
                   memory_efficient ? "output's" : "input's", " dtype; got ", dtype_name(s.scalar_type()));
  const auto stream = c10::cuda::getCurrentCUDAStream();
  if (rows > 0) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dx_dtype, "core_ops norm backward (CUDA)", [&] {
      using in_t = scalar_t;
      using acc_t = acc_of<in_t>;
      constexpr int N = 16 / sizeof(in_t);
      const auto launch = [&](const auto* dyp, const auto* sp) {
        const bool vec = hidden % N == 0 && aligned(dyp, sizeof(*dyp) * N) && aligned(sp, sizeof(*sp) * N) &&
                         aligned(dx.data_ptr(), 16);
        const int threads = threads_for(hidden, vec ? N : 1);
        const acc_t *wp = w.const_data_ptr<acc_t>(), *bp = b.const_data_ptr<acc_t>();
        const acc_t *mp = m.const_data_ptr<acc_t>(), *rp = r.const_data_ptr<acc_t>();
        if (vec) {
          norm_bwd_dx_kernel<N><<<rows, threads, 0, stream>>>(dyp, sp, dx.data_ptr<in_t>(), wp, bp, mp, rp, hidden,
                                                             rms, memory_efficient, affine);
        } else {
          norm_bwd_dx_kernel<1><<<rows, threads, 0, stream>>>(dyp, sp, dx.data_ptr<in_t>(), wp, bp, mp, rp, hidden,
                                                             rms, memory_efficient, affine);
        }
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        if (affine || bias.has_value()) {
          const dim3 block(kColTile, kRowGroups), grid((hidden + kColTile - 1) / kColTile);
          norm_bwd_dw_kernel<<<grid, block, 0, stream>>>(dyp, sp, wp, bp, mp, rp, rows, hidden, rms, memory_efficient,
                                                         affine, dw.data_ptr<acc_t>(), db.data_ptr<acc_t>());
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        }
      };
      if (out_type == dx_dtype) {
        launch(dy.const_data_ptr<in_t>(), s.const_data_ptr<in_t>());
      } else if (memory_efficient) {
        launch(dy.const_data_ptr<float>(), s.const_data_ptr<float>());
      } else {
        launch(dy.const_data_ptr<float>(), s.const_data_ptr<in_t>());
      }
    });
  }
  at::Tensor dweight = affine ? dw.to(weight->scalar_type()).reshape(weight->sizes()) : at::empty({0}, s.options());
  at::Tensor dbias = bias.has_value() ? db.to(bias->scalar_type()).reshape(bias->sizes()) : at::empty({0}, s.options());
  return {dx, dweight, dbias};
}

Tensor3 fused_add_rms_norm_fwd(const at::Tensor& input, const at::Tensor& residual,
                               const std::optional<at::Tensor>& weight, int64_t hidden, double eps,
                               bool /*memory_efficient: for autograd*/) {
  const c10::cuda::CUDAGuard guard(input.device());
  auto [x, res, y, h, rstd, w, rows] = add_rms_norm_io(input, residual, weight, hidden);
  if (rows == 0) return {y, h, rstd};
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "core_ops fused_add_rms_norm (CUDA)", [&] {
    using in_t = scalar_t;
    using acc_t = acc_of<in_t>;
    constexpr int N = 16 / sizeof(in_t);
    const bool vec = hidden % N == 0 && aligned(x.const_data_ptr(), 16) && aligned(res.const_data_ptr(), 16);
    const int threads = threads_for(hidden, vec ? N : 1);
    const auto args = std::make_tuple(x.const_data_ptr<in_t>(), res.const_data_ptr<in_t>(), h.data_ptr<in_t>(),
                                      y.data_ptr<in_t>(), w.const_data_ptr<acc_t>(), rstd.data_ptr<acc_t>(), hidden,
                                      acc_t(eps));
    if (vec) {
      std::apply([&](auto... a) { add_rms_fwd_kernel<N><<<rows, threads, 0, stream>>>(a...); }, args);
    } else {
      std::apply([&](auto... a) { add_rms_fwd_kernel<1><<<rows, threads, 0, stream>>>(a...); }, args);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {y, h, rstd};
}

}  // namespace

TORCH_LIBRARY_IMPL(core_ops, CUDA, m) {
  register_norm_kernels<&norm_fwd, &norm_bwd>(m, &fused_add_rms_norm_fwd);
}

}  // namespace core_ops::cuda::norms
