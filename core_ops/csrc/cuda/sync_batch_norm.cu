// CUDA kernels of the sync batch-norm ops: the checks and layouts of
// core_ops/sync_batch_norm_args.h, the math of core_ops/welford_math.h.
//
// Note [CUDA batch-norm reductions]: each channel's reduction is split into S slices
// (enough blocks to fill the GPU, each slice at least kMinPerSlice values); one block
// reduces a slice into a partial result (Welford's (mean, m2, count), or the two sums)
// in a scratch buffer, and a second kernel merges each channel's S partials in slice
// order, in double. The result is deterministic, and no float accumulator runs over
// more than about per_channel / (S * 256) values for planes, per_channel / (S * 8) for
// rows (a thread there owns one channel of a row group). Planes (contiguous input) give a
// block one channel, its threads walking the slice in memory order; rows
// (channels-last, 2-D) give a block 32 adjacent channels (coalesced reads) and 8 row
// groups. Threads load kIlp values before using them, so that enough loads are in
// flight to reach the memory bandwidth.
//
// Note [Channel cursor]: the kernels walk memory order with a fixed stride and track
// each element's plane column and channel incrementally, by deltas computed once,
// instead of dividing by L and C per element (a 64-bit division is a software routine
// of about a hundred instructions on the GPU).
#include <algorithm>
#include <optional>
#include <tuple>
#include <type_traits>

#include <cuda_runtime_api.h>
#include <torch/csrc/stable/library.h>

#include <core_ops/dispatch.h>
#include <core_ops/sync_batch_norm_args.h>
#include <core_ops/tensor.h>
#include <core_ops/welford_math.h>

#include "stream.cuh"

namespace core_ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kIlp = 4;
constexpr int kTileC = 32, kTileR = kThreads / kTileC;  // rows layout: channels x row groups
constexpr int64_t kMinPerSlice = 4096;
constexpr int64_t kMaxSlices = 64;

template <typename T>
using acc_of = std::conditional_t<std::is_same_v<T, double>, double, float>;

// --- the two reductions (Note [CUDA batch-norm reductions]) ---------------------------
// An accumulator: init(proto, channel), load(address) -> Values, push(Values),
// merge(other), store(out, field_stride) of its kFields partial values, and finish(),
// which merges a channel's partials in double into the op's two outputs. Accumulators
// are plain structs (no constructors): blocks keep them in shared memory.

template <typename scalar_t, typename acc_t>
struct StatsAcc {  // Welford over x -> (mean, biased variance)
  static constexpr int kFields = 3;
  using Values = acc_t;
  const scalar_t* x;
  acc_t mean, m2, count;
  __device__ void init(const StatsAcc& proto, int64_t) {
    *this = proto;
    mean = m2 = count = acc_t(0);
  }
  __device__ Values load(int64_t a) const { return static_cast<acc_t>(x[a]); }
  __device__ void push(Values v) {
    count += 1;
    welford_update(mean, m2, v, acc_t(1) / count);
  }
  __device__ void merge(const StatsAcc& o) { welford_combine(mean, m2, count, o.mean, o.m2, o.count); }
  __device__ void store(acc_t* out, int64_t stride) const {
    out[0] = mean;
    out[stride] = m2;
    out[2 * stride] = count;
  }
  __device__ static void finish(const acc_t* p, int64_t slice_stride, int64_t field_stride, int64_t slices,
                                acc_t* mean_out, acc_t* var_out) {
    double m = 0, q = 0, k = 0;
    for (int64_t s = 0; s < slices; ++s) {
      const acc_t* ps = p + s * slice_stride;
      welford_combine<double>(m, q, k, ps[0], ps[field_stride], ps[2 * field_stride]);
    }
    *mean_out = static_cast<acc_t>(m);
    *var_out = static_cast<acc_t>(k > 0 ? q / k : 0.0);
  }
};

template <typename scalar_t, typename acc_t>
struct SumsAcc {  // (sum dy, sum dy * (x - mean))
  static constexpr int kFields = 2;
  struct Values {
    acc_t dy, x;
  };
  const scalar_t* dy;
  const scalar_t* x;
  const acc_t* mean;
  acc_t mu, s, t;
  __device__ void init(const SumsAcc& proto, int64_t ch) {
    *this = proto;
    mu = mean[ch];
    s = t = acc_t(0);
  }
  __device__ Values load(int64_t a) const { return {static_cast<acc_t>(dy[a]), static_cast<acc_t>(x[a])}; }
  __device__ void push(Values v) {
    s += v.dy;
    t += v.dy * (v.x - mu);
  }
  __device__ void merge(const SumsAcc& o) {
    s += o.s;
    t += o.t;
  }
  __device__ void store(acc_t* out, int64_t stride) const {
    out[0] = s;
    out[stride] = t;
  }
  __device__ static void finish(const acc_t* p, int64_t slice_stride, int64_t field_stride, int64_t slices,
                                acc_t* sum_dy, acc_t* sum_dy_xmu) {
    double s = 0, t = 0;
    for (int64_t k = 0; k < slices; ++k) {
      s += p[k * slice_stride];
      t += p[k * slice_stride + field_stride];
    }
    *sum_dy = static_cast<acc_t>(s);
    *sum_dy_xmu = static_cast<acc_t>(t);
  }
};

// Partial (field f, slice s, channel ch) lives at partial[(f * S + s) * C + ch].

// Planes: block (channel, slice). Value k < n * l of channel ch lives at
// (k / l) * c * l + ch * l + k % l; a thread starts at lo + tid and steps kThreads
// values at a time (Note [Channel cursor]).
template <typename Acc, typename acc_t>
__global__ void plane_reduce_kernel(Acc proto, int64_t n, int64_t c, int64_t l, acc_t* partial) {
  __shared__ Acc buf[kThreads];
  const int64_t ch = blockIdx.x, s = blockIdx.y, slices = gridDim.y;
  const int64_t lo = n * l * s / slices, hi = n * l * (s + 1) / slices;
  const int64_t cl = c * l, dj = kThreads % l, da = (kThreads / l) * cl + dj;
  Acc acc;
  acc.init(proto, ch);
  int64_t k = lo + threadIdx.x, j = k % l, addr = (k / l) * cl + ch * l + j;
  while (k < hi) {
    int64_t a[kIlp];
    bool ok[kIlp];
#pragma unroll
    for (int u = 0; u < kIlp; ++u) {
      ok[u] = k < hi;
      a[u] = addr;
      k += kThreads;
      j += dj;
      addr += da;
      if (j >= l) {  // crossed into the next plane of this channel
        j -= l;
        addr += cl - l;
      }
    }
    typename Acc::Values v[kIlp];
#pragma unroll
    for (int u = 0; u < kIlp; ++u) {
      if (ok[u]) v[u] = acc.load(a[u]);
    }
#pragma unroll
    for (int u = 0; u < kIlp; ++u) {
      if (ok[u]) acc.push(v[u]);
    }
  }
  buf[threadIdx.x] = acc;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) buf[threadIdx.x].merge(buf[threadIdx.x + w]);
    __syncthreads();
  }
  if (threadIdx.x == 0) buf[0].store(partial + s * c + ch, slices * c);
}

// Rows: block (tile of kTileC channels, slice); thread (tx, ty) reads channel
// tile * kTileC + tx of rows lo + ty, lo + ty + kTileR, ...: a warp reads kTileC
// adjacent values of one row.
template <typename Acc, typename acc_t>
__global__ void row_reduce_kernel(Acc proto, int64_t rows, int64_t c, acc_t* partial) {
  __shared__ Acc buf[kTileR][kTileC];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t ch = blockIdx.x * int64_t(kTileC) + tx, s = blockIdx.y, slices = gridDim.y;
  const int64_t lo = rows * s / slices, hi = rows * (s + 1) / slices;
  Acc acc;
  acc.init(proto, ch < c ? ch : 0);
  if (ch < c) {
    for (int64_t r = lo + ty; r < hi; r += int64_t(kTileR) * kIlp) {
      typename Acc::Values v[kIlp];
#pragma unroll
      for (int u = 0; u < kIlp; ++u) {
        if (r + u * kTileR < hi) v[u] = acc.load((r + u * kTileR) * c + ch);
      }
#pragma unroll
      for (int u = 0; u < kIlp; ++u) {
        if (r + u * kTileR < hi) acc.push(v[u]);
      }
    }
  }
  buf[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && ch < c) {
    for (int g = 1; g < kTileR; ++g) acc.merge(buf[g][tx]);
    acc.store(partial + s * c + ch, slices * c);
  }
}

template <typename Acc, typename acc_t>
__global__ void merge_kernel(const acc_t* partial, int64_t slices, int64_t c, acc_t* out0, acc_t* out1) {
  for (int64_t ch = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; ch < c; ch += int64_t(gridDim.x) * blockDim.x) {
    Acc::finish(partial + ch, c, slices * c, slices, out0 + ch, out1 + ch);
  }
}

int sm_count(const Tensor& on) {
  int sms = 0;
  check_runtime(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, on.get_device_index()),
                "cudaDeviceGetAttribute");
  return std::max(sms, 1);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Note [CUDA batch-norm reductions]: out0 / out1 get the channel results of Acc.
template <typename Acc, typename acc_t>
void reduce_channels(const Acc& proto, const Layout& lay, const Tensor& like, acc_t* out0, acc_t* out1) {
  const int64_t per_channel = lay.n * lay.l;
  const int64_t channel_blocks = lay.rows ? ceil_div(lay.c, kTileC) : lay.c;
  const int64_t wanted = ceil_div(4 * int64_t(sm_count(like)), channel_blocks);
  const int64_t slices = std::clamp<int64_t>(std::min(wanted, per_channel / kMinPerSlice), 1, kMaxSlices);
  // An empty batch (n * l == 0) has zero partials: mean, variance and sums 0, as the
  // CPU kernel and the reference give (and no division by l == 0 below).
  const int64_t size = Acc::kFields * slices * lay.c;
  const Tensor partial = per_channel == 0 ? zeros({size}, dtype_of(like), like.device())
                                          : empty({size}, dtype_of(like), like.device());
  acc_t* p = data<acc_t>(partial);
  const cudaStream_t stream = current_stream(like.get_device_index());
  if (per_channel == 0) {
    // nothing to read
  } else if (lay.rows) {
    row_reduce_kernel<Acc, acc_t><<<dim3(channel_blocks, slices), dim3(kTileC, kTileR), 0, stream>>>(
        proto, per_channel, lay.c, p);
  } else {
    plane_reduce_kernel<Acc, acc_t><<<dim3(lay.c, slices), kThreads, 0, stream>>>(proto, lay.n, lay.c, lay.l, p);
  }
  check_launch(lay.rows ? "row_reduce_kernel" : "plane_reduce_kernel");
  const int merge_blocks = static_cast<int>(std::min<int64_t>(ceil_div(lay.c, kThreads), 65535));
  merge_kernel<Acc, acc_t><<<merge_blocks, kThreads, 0, stream>>>(p, slices, lay.c, out0, out1);
  check_launch("merge_kernel");
}

// --- elementwise (Note [Channel cursor]) ------------------------------------------------

// Deltas of one grid stride in memory order: rows layouts are planes of l = 1.
struct Stride {
  int64_t step, l, c, dj, dch;
};

Stride stride_of(const Layout& lay, int64_t step) {
  const int64_t l = lay.rows ? 1 : lay.l;
  return {step, l, lay.c, step % l, (step / l) % lay.c};
}

// A map over every element i in memory order with its channel: f.load(i) -> Values,
// then f.store(i, channel, values); kIlp elements per thread per round.
template <typename F>
__global__ void channel_map_kernel(F f, int64_t numel, Stride st) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  int64_t j = i % st.l, ch = (i / st.l) % st.c;
  while (i < numel) {
    int64_t idx[kIlp], chs[kIlp];
#pragma unroll
    for (int u = 0; u < kIlp; ++u) {
      idx[u] = i;
      chs[u] = ch;
      i += st.step;
      j += st.dj;
      ch += st.dch;
      if (j >= st.l) {
        j -= st.l;
        ++ch;
      }
      if (ch >= st.c) ch -= st.c;
    }
    typename F::Values v[kIlp];
#pragma unroll
    for (int u = 0; u < kIlp; ++u) {
      if (idx[u] < numel) v[u] = f.load(idx[u]);
    }
#pragma unroll
    for (int u = 0; u < kIlp; ++u) {
      if (idx[u] < numel) f.store(idx[u], chs[u], v[u]);
    }
  }
}

// The per-channel factors (scale = invstd * weight, k = invstd^2 * mean_dy_xmu) are
// formed in the kernels, each product rounded as the CPU kernel rounds it: on a GPU
// every separate tensor op would be one more kernel launch per step. A null weight
// or bias stands for ones or zeros.
template <typename acc_t>
__device__ acc_t scale_of(const acc_t* invstd, const acc_t* weight, int64_t ch) {
  return weight == nullptr ? invstd[ch] : invstd[ch] * weight[ch];
}

template <typename scalar_t, typename acc_t>
struct ElemtForward {
  using Values = acc_t;
  const scalar_t* x;
  scalar_t* y;
  const acc_t *mean, *invstd, *weight, *bias;
  __device__ Values load(int64_t i) const { return static_cast<acc_t>(x[i]); }
  __device__ void store(int64_t i, int64_t ch, Values v) const {
    const acc_t shift = bias == nullptr ? acc_t(0) : bias[ch];
    y[i] = static_cast<scalar_t>(batch_norm_elemt_math(v, mean[ch], scale_of(invstd, weight, ch), shift));
  }
};

template <typename scalar_t, typename acc_t>
struct ElemtBackward {
  struct Values {
    acc_t dy, x;
  };
  const scalar_t *dy, *x;
  scalar_t* dx;
  const acc_t *mean, *invstd, *weight, *mean_dy, *mean_dy_xmu;
  __device__ Values load(int64_t i) const { return {static_cast<acc_t>(dy[i]), static_cast<acc_t>(x[i])}; }
  __device__ void store(int64_t i, int64_t ch, Values v) const {
    const acc_t k = invstd[ch] * invstd[ch] * mean_dy_xmu[ch];
    dx[i] = static_cast<scalar_t>(
        batch_norm_backward_elemt_math(v.dy, v.x, mean[ch], mean_dy[ch], k, scale_of(invstd, weight, ch)));
  }
};

// weight / bias as contiguous accumulation-type tensors (no copy when they already
// are), or none when absent.
OptionalTensor per_channel_or_none(const OptionalTensor& t, ScalarType acc) {
  if (!t.has_value()) return std::nullopt;
  return core_ops::contiguous(torch::stable::to(*t, acc));
}

template <typename acc_t>
const acc_t* ptr_or_null(const OptionalTensor& t) {
  return t.has_value() ? data<const acc_t>(*t) : nullptr;
}

template <typename F>
void map_channels(const F& f, const Layout& lay, const Tensor& like) {
  const int64_t numel = lay.n * lay.c * lay.l;
  if (numel == 0) return;
  // 8 blocks of 256 threads fill an SM; more only repeat the grid-stride loop.
  const int64_t blocks = std::min<int64_t>(ceil_div(numel, kThreads * kIlp), 8 * int64_t(sm_count(like)));
  channel_map_kernel<F><<<blocks, kThreads, 0, current_stream(like.get_device_index())>>>(
      f, numel, stride_of(lay, blocks * kThreads));
  check_launch("channel_map_kernel");
}

// --- the ops ----------------------------------------------------------------------------

std::tuple<Tensor, Tensor> sync_batch_norm_stats(const Tensor& input) {
  check_batch_norm_args(input, nullptr, {}, std::nullopt, std::nullopt);
  const DeviceGuard guard(input.get_device_index());
  const ScalarType acc = dtype_of(input) == ScalarType::Double ? ScalarType::Double : ScalarType::Float;
  const Tensor mean = empty({input.size(1)}, acc, input.device());
  const Tensor var = core_ops::empty_like(mean);
  const Layout lay = layout_of(input, reads_rows(input));
  if (lay.c == 0) return {mean, var};
  CORE_OPS_DISPATCH_FLOATING(dtype_of(input), "input", scalar_t, {
    using acc_t = acc_of<scalar_t>;
    StatsAcc<scalar_t, acc_t> proto{data<const scalar_t>(lay.data)};
    reduce_channels(proto, lay, mean, data<acc_t>(mean), data<acc_t>(var));
  });
  return {mean, var};
}

std::tuple<Tensor, Tensor> sync_batch_norm_backward_reduce(const Tensor& grad_out, const Tensor& input,
                                                           const Tensor& mean) {
  check_batch_norm_args(input, &grad_out, {{"mean", &mean}}, std::nullopt, std::nullopt);
  const DeviceGuard guard(input.get_device_index());
  const Tensor sum_dy = core_ops::empty_like(mean), sum_dy_xmu = core_ops::empty_like(mean);
  const bool rows = reads_rows(input);
  const Layout lay = layout_of(input, rows), g = layout_of(grad_out, rows);
  const Tensor m = core_ops::contiguous(mean);
  if (lay.c == 0) return {sum_dy, sum_dy_xmu};
  CORE_OPS_DISPATCH_FLOATING(dtype_of(input), "input", scalar_t, {
    using acc_t = acc_of<scalar_t>;
    SumsAcc<scalar_t, acc_t> proto{data<const scalar_t>(g.data), data<const scalar_t>(lay.data),
                                   data<const acc_t>(m)};
    reduce_channels(proto, lay, mean, data<acc_t>(sum_dy), data<acc_t>(sum_dy_xmu));
  });
  return {sum_dy, sum_dy_xmu};
}

Tensor sync_batch_norm_elemt(const Tensor& input, const Tensor& mean, const Tensor& invstd,
                             const OptionalTensor& weight, const OptionalTensor& bias) {
  check_batch_norm_args(input, nullptr, {{"mean", &mean}, {"invstd", &invstd}}, weight, bias);
  const DeviceGuard guard(input.get_device_index());
  const OptionalTensor w = per_channel_or_none(weight, dtype_of(invstd));
  const OptionalTensor b = per_channel_or_none(bias, dtype_of(invstd));
  const Tensor m = core_ops::contiguous(mean), is = core_ops::contiguous(invstd);
  const Layout lay = layout_of(input, reads_rows(input));
  const Tensor out = empty_in(lay, input);
  CORE_OPS_DISPATCH_FLOATING(dtype_of(input), "input", scalar_t, {
    using acc_t = acc_of<scalar_t>;
    ElemtForward<scalar_t, acc_t> f{data<const scalar_t>(lay.data), data<scalar_t>(out), data<const acc_t>(m),
                                    data<const acc_t>(is), ptr_or_null<acc_t>(w), ptr_or_null<acc_t>(b)};
    map_channels(f, lay, input);
  });
  return with_input_strides(out, input);
}

Tensor sync_batch_norm_backward_elemt(const Tensor& grad_out, const Tensor& input, const Tensor& mean,
                                      const Tensor& invstd, const OptionalTensor& weight, const Tensor& mean_dy,
                                      const Tensor& mean_dy_xmu) {
  check_batch_norm_args(input, &grad_out,
                        {{"mean", &mean}, {"invstd", &invstd}, {"mean_dy", &mean_dy}, {"mean_dy_xmu", &mean_dy_xmu}},
                        weight, std::nullopt);
  const DeviceGuard guard(input.get_device_index());
  const OptionalTensor w = per_channel_or_none(weight, dtype_of(invstd));
  const Tensor m = core_ops::contiguous(mean), is = core_ops::contiguous(invstd), mdy = core_ops::contiguous(mean_dy),
               mdxmu = core_ops::contiguous(mean_dy_xmu);
  const bool rows = reads_rows(input);
  const Layout lay = layout_of(input, rows), g = layout_of(grad_out, rows);
  const Tensor out = empty_in(lay, input);
  CORE_OPS_DISPATCH_FLOATING(dtype_of(input), "input", scalar_t, {
    using acc_t = acc_of<scalar_t>;
    ElemtBackward<scalar_t, acc_t> f{data<const scalar_t>(g.data), data<const scalar_t>(lay.data),
                                     data<scalar_t>(out), data<const acc_t>(m), data<const acc_t>(is),
                                     ptr_or_null<acc_t>(w), data<const acc_t>(mdy), data<const acc_t>(mdxmu)};
    map_channels(f, lay, input);
  });
  return with_input_strides(out, input);
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(core_ops, CUDA, m) {
  m.impl("sync_batch_norm_stats", TORCH_BOX(&sync_batch_norm_stats));
  m.impl("sync_batch_norm_elemt", TORCH_BOX(&sync_batch_norm_elemt));
  m.impl("sync_batch_norm_backward_reduce", TORCH_BOX(&sync_batch_norm_backward_reduce));
  m.impl("sync_batch_norm_backward_elemt", TORCH_BOX(&sync_batch_norm_backward_elemt));
}

}  // namespace core_ops::cuda
