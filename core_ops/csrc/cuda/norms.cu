// CUDA kernels of the layer-norm and RMS-norm ops (Note [Norm ops] in _schemas.py): the
// checks of core_ops/norm_args.h, the math of core_ops/norm_math.h.
//
// Note [CUDA norm kernels]: the ops are bound by memory (a row is read once and
// written once in the forward; dy and x read once, dx written once in the backward),
// so the kernels are built to move bytes at the copy rate:
// - A block works on one row at a time; its threads read the row in packs of 16 bytes
//   (when the row's length is a multiple of the pack and the pointers are aligned; else
//   one value at a time), thread t the packs t, t + T, t + 2T, ...: a warp reads 512
//   adjacent bytes.
// - Rows of up to kMaxThreads * kValues values are read once, into registers (kValues
//   a thread: 64 bytes of fp32, 32 of bf16 in flight per thread), and every pass (sum,
//   centred squares, output; or the two sums of the backward, then dx) works on them.
//   Longer rows read the row again for each pass (from L2; a row is at most a few MB).
// - Sums over a row: warp shuffles and one shared-memory step, in a fixed order.
// - Backward: a grid of about one wave of blocks walks the rows; each thread owns the
//   same columns in every row, so it adds its columns' dw and db terms in registers
//   as it writes dx (x and dy are read once for all three grads), and each block
//   leaves one row of partial sums; a second kernel adds the partials of a column in a
//   fixed order (no atomics: the same result every run on a device). Long rows, whose
//   columns do not fit a thread's registers, get dw and db from a kernel over columns.
// - The flags (RMS, memory_efficient, affine) are uniform over a launch, so their
//   branches cost nothing and are not template parameters (fewer kernels to compile).
#include <algorithm>
#include <cstdint>
#include <optional>
#include <tuple>
#include <type_traits>

#include <torch/csrc/stable/library.h>

#include <core_ops/dispatch.h>
#include <core_ops/norm_args.h>
#include <core_ops/norm_math.h>
#include <core_ops/tensor.h>

#include "stream.cuh"

namespace core_ops::cuda::norms {
namespace {

template <typename T>
using acc_of = std::conditional_t<std::is_same_v<T, double>, double, float>;

constexpr int kValues = 16;       // values of a row a thread keeps in registers
constexpr int kMaxThreads = 1024;  // so rows of up to 16384 values are read once
constexpr int kLongRowThreads = 512;
constexpr int kColTile = 32, kRowGroups = 8;

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

template <int N, typename T>
__device__ __forceinline__ Pack<T, N> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, N>*>(p);
}

template <int N, typename T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, N>& v) {
  *reinterpret_cast<Pack<T, N>*>(p) = v;
}

// Packs a thread holds: kValues / N when the row is kept in registers, else one at a time.
template <bool kCached, int N>
constexpr int kSlots = kCached ? (kValues / N > 0 ? kValues / N : 1) : 1;

// f(slot, pack index) over this thread's packs of a row of `packs` packs.
template <bool kCached, int N, typename F>
__device__ __forceinline__ void for_packs(int64_t packs, F&& f) {
  if constexpr (kCached) {
#pragma unroll
    for (int i = 0; i < kSlots<kCached, N>; ++i) {
      const int64_t p = threadIdx.x + int64_t(i) * blockDim.x;
      if (p < packs) f(i, p);
    }
  } else {
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) f(0, p);
  }
}

// A row as this thread sees it: its packs in registers (kCached) or read on each use.
template <bool kCached, int N, typename T>
struct Row {
  const T* ptr;
  Pack<T, N> cache[kSlots<kCached, N>];

  __device__ __forceinline__ Row(const T* row, int64_t packs) : ptr(row) {
    if constexpr (kCached) {
      for_packs<kCached, N>(packs, [&](int i, int64_t p) { cache[i] = load_pack<N>(ptr + p * N); });
    }
  }
  __device__ __forceinline__ Pack<T, N> operator()(int i, int64_t p) const {
    if constexpr (kCached) {
      return cache[i];
    } else {
      return load_pack<N>(ptr + p * N);
    }
  }
};

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

// One row a block: statistics, then y.
template <bool kCached, int N, typename in_t, typename out_t, typename acc_t>
__global__ void norm_fwd_kernel(const in_t* __restrict__ x, out_t* __restrict__ y, const acc_t* __restrict__ w,
                                const acc_t* __restrict__ b, acc_t* __restrict__ mean_out,
                                acc_t* __restrict__ rstd_out, int64_t n, acc_t eps, bool rms) {
  __shared__ acc_t shared[32];
  const int64_t row = blockIdx.x, packs = n / N;
  const Row<kCached, N, in_t> xr(x + row * n, packs);
  out_t* yr = y + row * n;
  acc_t mean = 0;
  if (!rms) {
    acc_t s = 0;
    for_packs<kCached, N>(packs, [&](int i, int64_t p) {
      const auto v = xr(i, p);
#pragma unroll
      for (int k = 0; k < N; ++k) s += static_cast<acc_t>(v.v[k]);
    });
    mean = block_sum(s, shared) / acc_t(n);
  }
  acc_t q = 0;
  for_packs<kCached, N>(packs, [&](int i, int64_t p) {
    const auto v = xr(i, p);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const acc_t d = static_cast<acc_t>(v.v[k]) - mean;
      q += d * d;
    }
  });
  const acc_t rstd = acc_t(1) / sqrt(block_sum(q, shared) / acc_t(n) + eps);
  if (threadIdx.x == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
  for_packs<kCached, N>(packs, [&](int i, int64_t p) {
    const auto v = xr(i, p);
    const int64_t j = p * N;
    Pack<out_t, N> o;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const acc_t a = static_cast<acc_t>(v.v[k]);
      o.v[k] = static_cast<out_t>(rms ? rms_norm_out(a, rstd, w[j + k])
                                      : layer_norm_out(a, mean, rstd, w[j + k], b[j + k]));
    }
    store_pack<N>(yr + j, o);
  });
}

// Rows blockIdx.x, blockIdx.x + gridDim.x, ...: dx, and with `part` (kCached only) the
// block's partial dw in part[blockIdx.x] and db in part[gridDim.x + blockIdx.x] (rows
// of n values).
template <bool kCached, int N, typename in_t, typename out_t, typename saved_t, typename acc_t>
__global__ void norm_bwd_kernel(const out_t* __restrict__ dy, const saved_t* __restrict__ s, in_t* __restrict__ dx,
                                const acc_t* __restrict__ w, const acc_t* __restrict__ b,
                                const acc_t* __restrict__ mean, const acc_t* __restrict__ rstd, int64_t rows,
                                int64_t n, bool rms, bool from_out, bool affine, acc_t* __restrict__ part) {
  constexpr int K = kSlots<kCached, N>;
  __shared__ acc_t shared[32];
  const int64_t packs = n / N;
  acc_t pw[K][N] = {}, pb[K][N] = {};
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const Row<kCached, N, out_t> d(dy + row * n, packs);
    const Row<kCached, N, saved_t> v(s + row * n, packs);
    const acc_t m = rms ? acc_t(0) : mean[row], r = rstd[row];
    acc_t sg = 0, sgx = 0;
    for_packs<kCached, N>(packs, [&](int i, int64_t p) {
      const auto dp = d(i, p);
      const auto vp = v(i, p);
      const int64_t j = p * N;
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const acc_t g = static_cast<acc_t>(dp.v[k]) * w[j + k];
        sg += g;
        sgx += g * xhat_of<acc_t>(vp.v[k], j + k, w, b, m, r, rms, from_out, affine);
      }
    });
    const acc_t inv_n = acc_t(1) / acc_t(n);
    const acc_t mean_g = rms ? acc_t(0) : block_sum(sg, shared) * inv_n;
    const acc_t mean_gx = block_sum(sgx, shared) * inv_n;
    in_t* dxr = dx + row * n;
    for_packs<kCached, N>(packs, [&](int i, int64_t p) {
      const auto dp = d(i, p);
      const auto vp = v(i, p);
      const int64_t j = p * N;
      Pack<in_t, N> o;
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const acc_t dyk = static_cast<acc_t>(dp.v[k]);
        const acc_t xh = xhat_of<acc_t>(vp.v[k], j + k, w, b, m, r, rms, from_out, affine);
        o.v[k] = static_cast<in_t>(layer_norm_dx(dyk * w[j + k], xh, r, mean_g, mean_gx));
        if constexpr (kCached) {
          pw[i][k] += dyk * xh;
          pb[i][k] += dyk;
        }
      }
      store_pack<N>(dxr + j, o);
    });
  }
  if constexpr (kCached) {
    if (part == nullptr) return;
    acc_t* pwr = part + int64_t(blockIdx.x) * n;
    acc_t* pbr = part + int64_t(gridDim.x + blockIdx.x) * n;
    for_packs<kCached, N>(packs, [&](int i, int64_t p) {
#pragma unroll
      for (int k = 0; k < N; ++k) {
        pwr[p * N + k] = pw[i][k];
        pbr[p * N + k] = pb[i][k];
      }
    });
  }
}

template <typename T>
struct Two {
  T w, b;
};

// dw[j] and db[j] as the sums over `rows` of two [rows, n] matrices, a[r][j] and
// b[r][j]: a block owns 32 adjacent columns (coalesced reads) and 8 row groups, each
// thread sums its rows in registers and the 8 groups are added in a fixed order.
// `term(r, j)` gives the pair (a, b) of a row and column.
template <typename acc_t, typename Term>
__device__ void column_sums(int64_t rows, int64_t n, Term term, acc_t* __restrict__ dw, acc_t* __restrict__ db) {
  __shared__ acc_t sw[kRowGroups][kColTile + 1], sb[kRowGroups][kColTile + 1];
  const int64_t j = int64_t(blockIdx.x) * kColTile + threadIdx.x;
  acc_t aw = 0, ab = 0;
  if (j < n) {
    for (int64_t r = threadIdx.y; r < rows; r += kRowGroups) {
      const Two<acc_t> t = term(r, j);
      aw += t.w;
      ab += t.b;
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

// dw and db of the blocks' partial rows (norm_bwd_kernel's `part`, `blocks` of each).
template <typename acc_t>
__global__ void partial_sums_kernel(const acc_t* __restrict__ part, int64_t blocks, int64_t n, acc_t* __restrict__ dw,
                                    acc_t* __restrict__ db) {
  const auto term = [&](int64_t r, int64_t j) { return Two<acc_t>{part[r * n + j], part[(blocks + r) * n + j]}; };
  column_sums<acc_t>(blocks, n, term, dw, db);
}

// dw and db of long rows, from dy and the saved tensor.
template <typename out_t, typename saved_t, typename acc_t>
__global__ void norm_bwd_dw_kernel(const out_t* __restrict__ dy, const saved_t* __restrict__ s,
                                   const acc_t* __restrict__ w, const acc_t* __restrict__ b,
                                   const acc_t* __restrict__ mean, const acc_t* __restrict__ rstd, int64_t rows,
                                   int64_t n, bool rms, bool from_out, bool affine, acc_t* __restrict__ dw,
                                   acc_t* __restrict__ db) {
  const auto term = [&](int64_t r, int64_t j) {
    const acc_t d = static_cast<acc_t>(dy[r * n + j]);
    const acc_t xh = xhat_of<acc_t>(s[r * n + j], j, w, b, rms ? acc_t(0) : mean[r], rstd[r], rms, from_out, affine);
    return Two<acc_t>{d * xh, d};
  };
  column_sums<acc_t>(rows, n, term, dw, db);
}

// fused_add_rms_norm: h = x + r (rounded to in_t, as stored) and its squares in one read
// of x and r; then y from h (registers, or this thread's own writes of h for long rows).
template <bool kCached, int N, typename in_t, typename acc_t>
__global__ void add_rms_fwd_kernel(const in_t* __restrict__ x, const in_t* __restrict__ r, in_t* __restrict__ h,
                                   in_t* __restrict__ y, const acc_t* __restrict__ w, acc_t* __restrict__ rstd_out,
                                   int64_t n, acc_t eps) {
  __shared__ acc_t shared[32];
  const int64_t o = int64_t(blockIdx.x) * n, packs = n / N;
  Pack<in_t, N> hs[kSlots<kCached, N>];
  acc_t q = 0;
  for_packs<kCached, N>(packs, [&](int i, int64_t p) {
    const auto a = load_pack<N>(x + o + p * N);
    const auto c = load_pack<N>(r + o + p * N);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      hs[i].v[k] = static_cast<in_t>(static_cast<acc_t>(a.v[k]) + static_cast<acc_t>(c.v[k]));
      const acc_t v = static_cast<acc_t>(hs[i].v[k]);
      q += v * v;
    }
    store_pack<N>(h + o + p * N, hs[i]);
  });
  const acc_t rstd = acc_t(1) / sqrt(block_sum(q, shared) / acc_t(n) + eps);
  if (threadIdx.x == 0) rstd_out[blockIdx.x] = rstd;
  for_packs<kCached, N>(packs, [&](int i, int64_t p) {
    const auto s = kCached ? hs[i] : load_pack<N>(h + o + p * N);
    Pack<in_t, N> out;
#pragma unroll
    for (int k = 0; k < N; ++k) out.v[k] = static_cast<in_t>(rms_norm_out(static_cast<acc_t>(s.v[k]), rstd, w[p * N + k]));
    store_pack<N>(y + o + p * N, out);
  });
}

bool aligned(const void* p, int bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Rows of up to this many packs are kept in registers (Note [CUDA norm kernels]).
template <int N>
bool cached(int64_t packs) {
  return packs <= int64_t(kMaxThreads) * kSlots<true, N>;
}

// Threads for a cached row: kSlots packs each, a whole number of warps.
template <int N>
int cached_threads(int64_t packs) {
  const int64_t want = ((packs + kSlots<true, N> - 1) / kSlots<true, N> + 31) / 32 * 32;
  return static_cast<int>(std::clamp<int64_t>(want, 32, kMaxThreads));
}

// Blocks of `threads` that run at once on `device`: the backward's grid.
template <typename Kernel>
int64_t one_wave(Kernel kernel, int threads, DeviceIndex device) {
  int sms = 0, per_sm = 0;
  check_runtime(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  check_runtime(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0),
                "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  return int64_t(sms) * std::max(per_sm, 1);
}

template <int N, typename in_t, typename out_t, typename acc_t>
void launch_fwd(const in_t* x, out_t* y, const acc_t* w, const acc_t* b, acc_t* mean, acc_t* rstd, int64_t rows,
                int64_t n, acc_t eps, bool rms, cudaStream_t stream) {
  const int64_t packs = n / N;
  if (cached<N>(packs)) {
    norm_fwd_kernel<true, N><<<rows, cached_threads<N>(packs), 0, stream>>>(x, y, w, b, mean, rstd, n, eps, rms);
  } else {
    norm_fwd_kernel<false, N><<<rows, kLongRowThreads, 0, stream>>>(x, y, w, b, mean, rstd, n, eps, rms);
  }
  check_launch("norm_fwd_kernel");
}

// dx, and dw and db unless `dw` is null.
template <int N, typename in_t, typename out_t, typename saved_t, typename acc_t>
void launch_bwd(const out_t* dy, const saved_t* s, in_t* dx, const acc_t* w, const acc_t* b, const acc_t* m,
                const acc_t* r, int64_t rows, int64_t n, bool rms, bool from_out, bool affine, acc_t* dw, acc_t* db,
                const Device& device, cudaStream_t stream) {
  const int64_t packs = n / N;
  const dim3 col_block(kColTile, kRowGroups), col_grid((n + kColTile - 1) / kColTile);
  if (cached<N>(packs)) {
    const auto kernel = norm_bwd_kernel<true, N, in_t, out_t, saved_t, acc_t>;
    const int threads = cached_threads<N>(packs);
    const int64_t blocks = std::min(rows, one_wave(kernel, threads, device.index()));
    // Each block's partial dw and db rows; freed to the caching allocator on this stream.
    const ScalarType acc = std::is_same_v<acc_t, double> ? ScalarType::Double : ScalarType::Float;
    const OptionalTensor part = dw ? OptionalTensor(empty({2, blocks, n}, acc, device)) : std::nullopt;
    kernel<<<blocks, threads, 0, stream>>>(dy, s, dx, w, b, m, r, rows, n, rms, from_out, affine,
                                           dw ? data<acc_t>(*part) : nullptr);
    check_launch("norm_bwd_kernel");
    if (dw) {
      partial_sums_kernel<<<col_grid, col_block, 0, stream>>>(data<const acc_t>(*part), blocks, n, dw, db);
      check_launch("partial_sums_kernel");
    }
  } else {
    const auto kernel = norm_bwd_kernel<false, N, in_t, out_t, saved_t, acc_t>;
    const int64_t blocks = std::min(rows, one_wave(kernel, kLongRowThreads, device.index()));
    kernel<<<blocks, kLongRowThreads, 0, stream>>>(dy, s, dx, w, b, m, r, rows, n, rms, from_out, affine, nullptr);
    check_launch("norm_bwd_kernel");
    if (dw) {
      norm_bwd_dw_kernel<<<col_grid, col_block, 0, stream>>>(dy, s, w, b, m, r, rows, n, rms, from_out, affine, dw, db);
      check_launch("norm_bwd_dw_kernel");
    }
  }
}

// A new contiguous tensor of `like`'s shape and device.
Tensor empty_shaped(const Tensor& like, ScalarType dtype) {
  return core_ops::empty(like.sizes(), dtype, like.device());
}

Tensor3 norm_fwd(const Tensor& input, const OptTensor& weight, const OptTensor& bias, int64_t hidden, double eps,
                 std::optional<ScalarType> out_dtype, bool rms) {
  // Arguments checked by the op's entry point (norm_args.h layer_norm_fwd / rms_norm_fwd).
  const DeviceIndex device = input.get_device_index();
  const DeviceGuard guard(device);
  const Tensor x = core_ops::contiguous(input);
  const int64_t rows = x.numel() / hidden;
  const ScalarType in = dtype_of(x), out_type = out_dtype.value_or(in);
  const ScalarType acc = in == ScalarType::Double ? ScalarType::Double : ScalarType::Float;
  const Tensor out = empty_shaped(input, out_type);
  const Tensor mean = empty({rows}, acc, x.device()), rstd = empty({rows}, acc, x.device());
  if (rows == 0) return {out, mean, rstd};
  const Tensor w = acc_param(weight, hidden, acc, 1, x), b = acc_param(bias, hidden, acc, 0, x);
  const cudaStream_t stream = current_stream(device);
  const auto run = [&](auto in_tag) {
    using in_t = decltype(in_tag);
    using acc_t = acc_of<in_t>;
    constexpr int N = 16 / sizeof(in_t);
    const auto launch = [&](auto* y) {
      using out_t = std::remove_pointer_t<decltype(y)>;
      const auto args = std::make_tuple(data<const in_t>(x), y, data<const acc_t>(w), data<const acc_t>(b),
                                        data<acc_t>(mean), data<acc_t>(rstd), rows, hidden, acc_t(eps), rms, stream);
      if (hidden % N == 0 && aligned(x.data_ptr(), 16) && aligned(y, sizeof(out_t) * N)) {
        std::apply([&](auto... a) { launch_fwd<N>(a...); }, args);
      } else {
        std::apply([](auto... a) { launch_fwd<1>(a...); }, args);
      }
    };
    if (out_type == in) {
      launch(data<in_t>(out));
    } else {
      launch(data<float>(out));
    }
  };
  CORE_OPS_DISPATCH_FLOATING(in, "input", in_t, run(in_t{}));
  return {out, mean, rstd};
}

// A weight's or bias's grad: the column sums in its dtype and shape; absent, an empty
// tensor of saved's dtype.
Tensor param_grad(const OptionalTensor& sums, const OptTensor& param, const Tensor& saved) {
  if (!param.has_value()) return empty({0}, dtype_of(saved), saved.device());
  return torch::stable::reshape(torch::stable::to(*sums, dtype_of(*param)), param->sizes());
}

Tensor3 norm_bwd(const Tensor& grad_out, const Tensor& saved, const Tensor& mean, const Tensor& rstd,
                 const OptTensor& weight, const OptTensor& bias, int64_t hidden, bool memory_efficient,
                 ScalarType dx_dtype, bool rms) {
  // Arguments checked by the op's entry point (norm_args.h layer_norm_bwd / rms_norm_bwd).
  const DeviceIndex device = saved.get_device_index();
  const DeviceGuard guard(device);
  const Tensor dy = core_ops::contiguous(grad_out), s = core_ops::contiguous(saved);
  const int64_t rows = s.numel() / hidden;
  const ScalarType acc = dx_dtype == ScalarType::Double ? ScalarType::Double : ScalarType::Float;
  const Tensor dx = empty_shaped(saved, dx_dtype);
  if (rows == 0) return no_rows_backward(dx, weight, bias, s);
  const Tensor w = acc_param(weight, hidden, acc, 1, s), b = acc_param(bias, hidden, acc, 0, s);
  // From the output, xhat undoes the affine map: a bias alone shifts it too.
  const bool affine = weight.has_value() || (!rms && bias.has_value());
  const bool want_wb = weight.has_value() || bias.has_value();
  // The kernels write every column of dw and db when there are rows to sum.
  const auto make_wb = [&] {
    return OptionalTensor(rows > 0 ? empty({hidden}, acc, s.device()) : zeros({hidden}, acc, s.device()));
  };
  const OptionalTensor dw = want_wb ? make_wb() : std::nullopt, db = want_wb ? make_wb() : std::nullopt;
  const Tensor m = core_ops::contiguous(rms ? rstd : mean), r = core_ops::contiguous(rstd);
  const ScalarType out_type = dtype_of(dy);  // its pairing with dx_dtype: check_norm_bwd_args
  const cudaStream_t stream = current_stream(device);
  const auto run = [&](auto in_tag) {
    using in_t = decltype(in_tag);
    using acc_t = acc_of<in_t>;
    constexpr int N = 16 / sizeof(in_t);
    const auto launch = [&](const auto* dyp, const auto* sp) {
      const auto args = std::make_tuple(dyp, sp, data<in_t>(dx), data<const acc_t>(w), data<const acc_t>(b),
                                        data<const acc_t>(m), data<const acc_t>(r), rows, hidden, rms,
                                        memory_efficient, affine, want_wb ? data<acc_t>(*dw) : nullptr,
                                        want_wb ? data<acc_t>(*db) : nullptr, s.device(), stream);
      if (hidden % N == 0 && aligned(dyp, sizeof(*dyp) * N) && aligned(sp, sizeof(*sp) * N) &&
          aligned(dx.data_ptr(), 16)) {
        std::apply([&](auto... a) { launch_bwd<N>(a...); }, args);
      } else {
        std::apply([](auto... a) { launch_bwd<1>(a...); }, args);
      }
    };
    if (out_type == dx_dtype) {
      launch(data<const in_t>(dy), data<const in_t>(s));
    } else if (memory_efficient) {
      launch(data<const float>(dy), data<const float>(s));
    } else {
      launch(data<const float>(dy), data<const in_t>(s));
    }
  };
  if (rows > 0) {
    CORE_OPS_DISPATCH_FLOATING(dx_dtype, "dx_dtype", in_t, run(in_t{}));
  }
  return {dx, param_grad(dw, weight, s), param_grad(db, bias, s)};
}

Tensor3 fused_add_rms_norm_fwd(const Tensor& input, const Tensor& residual, const OptTensor& weight, int64_t hidden,
                               double eps, bool /*memory_efficient: for autograd*/) {
  const DeviceIndex device = input.get_device_index();
  const DeviceGuard guard(device);
  // Named members, not structured bindings: C++17 lambdas cannot capture those.
  const AddRmsNormIo io = add_rms_norm_io(input, residual, weight, hidden);
  const int64_t rows = io.rows;
  if (rows == 0) return {io.y, io.h, io.rstd};
  const cudaStream_t stream = current_stream(device);
  const auto run = [&](auto in_tag) {
    using in_t = decltype(in_tag);
    using acc_t = acc_of<in_t>;
    constexpr int N = 16 / sizeof(in_t);
    const auto args = std::make_tuple(data<const in_t>(io.x), data<const in_t>(io.residual), data<in_t>(io.h),
                                      data<in_t>(io.y), data<const acc_t>(io.w), data<acc_t>(io.rstd), hidden,
                                      acc_t(eps));
    const auto launch = [&](auto pack) {
      constexpr int P = decltype(pack)::value;
      const int64_t packs = hidden / P;
      if (cached<P>(packs)) {
        std::apply([&](auto... a) { add_rms_fwd_kernel<true, P><<<rows, cached_threads<P>(packs), 0, stream>>>(a...); },
                   args);
      } else {
        std::apply([&](auto... a) { add_rms_fwd_kernel<false, P><<<rows, kLongRowThreads, 0, stream>>>(a...); }, args);
      }
      check_launch("add_rms_fwd_kernel");
    };
    if (hidden % N == 0 && aligned(io.x.data_ptr(), 16) && aligned(io.residual.data_ptr(), 16)) {
      launch(std::integral_constant<int, N>());
    } else {
      launch(std::integral_constant<int, 1>());
    }
  };
  CORE_OPS_DISPATCH_FLOATING(dtype_of(io.x), "input", in_t, run(in_t{}));
  return {io.y, io.h, io.rstd};
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(core_ops, CUDA, m) {
  register_norm_kernels<&norm_fwd, &norm_bwd, &fused_add_rms_norm_fwd>(m);
}

}  // namespace core_ops::cuda::norms
