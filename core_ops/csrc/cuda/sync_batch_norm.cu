// CUDA kernels of the sync batch-norm ops: the checks and layouts of
// core_ops/sync_batch_norm_args.h, the math of core_ops/welford_math.h. Reductions run
// one block per channel (each thread a Welford / sum over a strided share, merged in
// shared memory); elementwise kernels are grid-stride over the memory order of the
// layout. Accumulation is float (double for double input).
#include <ATen/Dispatch.h>
#include <ATen/ops/zeros_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <core_ops/sync_batch_norm_args.h>
#include <core_ops/welford_math.h>

namespace core_ops::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
using acc_of = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Where element i (0 <= i < n * l) of channel ch lives, in either layout.
struct Addr {
  int64_t c, l;
  bool rows;
  __device__ int64_t operator()(int64_t ch, int64_t i) const {
    return rows ? i * c + ch : ((i / l) * c + ch) * l + i % l;
  }
  __device__ int64_t channel(int64_t flat) const { return rows ? flat % c : (flat / l) % c; }
};

template <typename scalar_t, typename acc_t>
__global__ void stats_kernel(const scalar_t* x, Addr at, int64_t per_channel, acc_t* mean_out, acc_t* var_out) {
  __shared__ acc_t sm[kThreads], sq[kThreads], sk[kThreads];
  const int64_t ch = blockIdx.x;
  acc_t m = 0, q = 0, k = 0;
  for (int64_t i = threadIdx.x; i < per_channel; i += blockDim.x) {
    k += 1;
    welford_update(m, q, static_cast<acc_t>(x[at(ch, i)]), acc_t(1) / k);
  }
  sm[threadIdx.x] = m;
  sq[threadIdx.x] = q;
  sk[threadIdx.x] = k;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) {
      welford_combine(sm[threadIdx.x], sq[threadIdx.x], sk[threadIdx.x], sm[threadIdx.x + s],
                      sq[threadIdx.x + s], sk[threadIdx.x + s]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    mean_out[ch] = sm[0];
    var_out[ch] = sk[0] > 0 ? sq[0] / sk[0] : acc_t(0);
  }
}

template <typename scalar_t, typename acc_t>
__global__ void sums_kernel(const scalar_t* dy, const scalar_t* x, Addr at, int64_t per_channel,
                            const acc_t* mean, acc_t* sum_dy, acc_t* sum_dy_xmu) {
  __shared__ acc_t ss[kThreads], st[kThreads];
  const int64_t ch = blockIdx.x;
  const acc_t mu = mean[ch];
  acc_t s = 0, t = 0;
  for (int64_t i = threadIdx.x; i < per_channel; i += blockDim.x) {
    const int64_t a = at(ch, i);
    const acc_t g = static_cast<acc_t>(dy[a]);
    s += g;
    t += g * (static_cast<acc_t>(x[a]) - mu);
  }
  ss[threadIdx.x] = s;
  st[threadIdx.x] = t;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) {
      ss[threadIdx.x] += ss[threadIdx.x + w];
      st[threadIdx.x] += st[threadIdx.x + w];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    sum_dy[ch] = ss[0];
    sum_dy_xmu[ch] = st[0];
  }
}

template <typename scalar_t, typename acc_t>
__global__ void elemt_kernel(const scalar_t* x, scalar_t* y, Addr at, int64_t numel, const acc_t* mean,
                             const acc_t* scale, const acc_t* shift) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < numel; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ch = at.channel(i);
    y[i] = static_cast<scalar_t>(batch_norm_elemt_math(static_cast<acc_t>(x[i]), mean[ch], scale[ch], shift[ch]));
  }
}

template <typename scalar_t, typename acc_t>
__global__ void backward_elemt_kernel(const scalar_t* dy, const scalar_t* x, scalar_t* dx, Addr at, int64_t numel,
                                      const acc_t* mean, const acc_t* mean_dy, const acc_t* k, const acc_t* scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < numel; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ch = at.channel(i);
    dx[i] = static_cast<scalar_t>(batch_norm_backward_elemt_math(
        static_cast<acc_t>(dy[i]), static_cast<acc_t>(x[i]), mean[ch], mean_dy[ch], k[ch], scale[ch]));
  }
}

Addr addr_of(const Layout& lay) { return {lay.c, lay.l, lay.rows}; }

int elementwise_blocks(int64_t numel) {
  return static_cast<int>(std::min<int64_t>((numel + kThreads - 1) / kThreads, 65535));
}

std::tuple<at::Tensor, at::Tensor> sync_batch_norm_stats(const at::Tensor& input) {
  check_batch_norm_args(input, nullptr, {}, std::nullopt, std::nullopt);
  const c10::cuda::CUDAGuard guard(input.device());
  const auto acc = input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor mean = at::empty({input.size(1)}, input.options().dtype(acc));
  at::Tensor var = at::empty_like(mean);
  const Layout lay = layout_of(input, reads_rows(input));
  if (lay.c == 0) return {mean, var};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "sync_batch_norm_stats", [&] {
    using acc_t = acc_of<scalar_t>;
    stats_kernel<scalar_t, acc_t><<<lay.c, kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        lay.data.const_data_ptr<scalar_t>(), addr_of(lay), lay.n * lay.l, mean.data_ptr<acc_t>(), var.data_ptr<acc_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {mean, var};
}

std::tuple<at::Tensor, at::Tensor> sync_batch_norm_backward_reduce(const at::Tensor& grad_out, const at::Tensor& input,
                                                                   const at::Tensor& mean) {
  check_batch_norm_args(input, &grad_out, {{"mean", &mean}}, std::nullopt, std::nullopt);
  const c10::cuda::CUDAGuard guard(input.device());
  at::Tensor sum_dy = at::empty_like(mean), sum_dy_xmu = at::empty_like(mean);
  const bool rows = reads_rows(input);
  const Layout lay = layout_of(input, rows), g = layout_of(grad_out, rows);
  const at::Tensor m = mean.contiguous();
  if (lay.c == 0) return {sum_dy, sum_dy_xmu};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "sync_batch_norm_backward_reduce", [&] {
    using acc_t = acc_of<scalar_t>;
    sums_kernel<scalar_t, acc_t><<<lay.c, kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        g.data.const_data_ptr<scalar_t>(), lay.data.const_data_ptr<scalar_t>(), addr_of(lay), lay.n * lay.l,
        m.const_data_ptr<acc_t>(), sum_dy.data_ptr<acc_t>(), sum_dy_xmu.data_ptr<acc_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {sum_dy, sum_dy_xmu};
}

at::Tensor sync_batch_norm_elemt(const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
                                 const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias) {
  check_batch_norm_args(input, nullptr, {{"mean", &mean}, {"invstd", &invstd}}, weight, bias);
  const c10::cuda::CUDAGuard guard(input.device());
  const at::Tensor scale = (weight.has_value() ? invstd.mul(weight->to(invstd.scalar_type())) : invstd).contiguous();
  const at::Tensor shift = bias.has_value() ? bias->to(invstd.scalar_type()).contiguous() : at::zeros_like(invstd);
  const at::Tensor m = mean.contiguous();
  const Layout lay = layout_of(input, reads_rows(input));
  at::Tensor out = empty_in(lay, input);
  const int64_t numel = input.numel();
  if (numel > 0) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "sync_batch_norm_elemt", [&] {
      using acc_t = acc_of<scalar_t>;
      elemt_kernel<scalar_t, acc_t><<<elementwise_blocks(numel), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
          lay.data.const_data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), addr_of(lay), numel,
          m.const_data_ptr<acc_t>(), scale.const_data_ptr<acc_t>(), shift.const_data_ptr<acc_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }
  return with_input_strides(out, input);
}

at::Tensor sync_batch_norm_backward_elemt(const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean,
                                          const at::Tensor& invstd, const std::optional<at::Tensor>& weight,
                                          const at::Tensor& mean_dy, const at::Tensor& mean_dy_xmu) {
  check_batch_norm_args(input, &grad_out,
                        {{"mean", &mean}, {"invstd", &invstd}, {"mean_dy", &mean_dy}, {"mean_dy_xmu", &mean_dy_xmu}},
                        weight, std::nullopt);
  const c10::cuda::CUDAGuard guard(input.device());
  const at::Tensor scale = (weight.has_value() ? invstd.mul(weight->to(invstd.scalar_type())) : invstd).contiguous();
  const at::Tensor k = invstd.mul(invstd).mul(mean_dy_xmu).contiguous();
  const at::Tensor m = mean.contiguous(), mdy = mean_dy.contiguous();
  const bool rows = reads_rows(input);
  const Layout lay = layout_of(input, rows), g = layout_of(grad_out, rows);
  at::Tensor out = empty_in(lay, input);
  const int64_t numel = input.numel();
  if (numel > 0) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "sync_batch_norm_backward_elemt", [&] {
      using acc_t = acc_of<scalar_t>;
      backward_elemt_kernel<scalar_t, acc_t><<<elementwise_blocks(numel), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
          g.data.const_data_ptr<scalar_t>(), lay.data.const_data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), addr_of(lay),
          numel, m.const_data_ptr<acc_t>(), mdy.const_data_ptr<acc_t>(), k.const_data_ptr<acc_t>(),
          scale.const_data_ptr<acc_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }
  return with_input_strides(out, input);
}

}  // namespace

TORCH_LIBRARY_IMPL(core_ops, CUDA, m) {
  m.impl("sync_batch_norm_stats", &sync_batch_norm_stats);
  m.impl("sync_batch_norm_elemt", &sync_batch_norm_elemt);
  m.impl("sync_batch_norm_backward_reduce", &sync_batch_norm_backward_reduce);
  m.impl("sync_batch_norm_backward_elemt", &sync_batch_norm_backward_elemt);
}

}  // namespace core_ops::cuda
