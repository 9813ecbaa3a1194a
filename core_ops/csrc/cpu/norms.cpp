// CPU kernels of the layer-norm and RMS-norm ops (Note [Norm ops] in _schemas.py): the
// math is core_ops/norm_math.h; this file moves memory. Rows run in parallel; within a
// row every pass is vectorized (vec.h, float32 lanes for float / half / bfloat16
// input, double scalars for double) over values that stay in cache between passes:
// forward reads a row three times (sum, centered squares, output), backward twice.
// Weight and bias grads are summed per block of rows into the block's own buffer and
// the blocks are added in a fixed order: no races, and the same result every run.
// The file has a namespace of its own: the unity build may put it in one translation
// unit with sync_batch_norm.cpp, whose helpers have the same names.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>

#include <core_ops/bool_switch.h>
#include <core_ops/dispatch.h>
#include <core_ops/norm_args.h>
#include <core_ops/norm_math.h>
#include <core_ops/tensor.h>

#include "level.h"
#include "multi_tensor_apply.h"
#include "stream_store.h"

CORE_OPS_CPU_BEGIN
namespace norms {
namespace {

// Sum of (x - mean)^2 over a row.
template <typename in_t, typename acc_t = acc_of<in_t>>
acc_t centered_squares(const in_t* x, int64_t n, acc_t mean) {
  acc_t sq = 0;
  int64_t j = 0;
  if constexpr (kVectorized<in_t>) {
    const fVec m(mean);
    fVec q0(0.f), q1(0.f);
    for (; j + kWidth <= n; j += kWidth) {
      fVec a, b;
      load2(x + j, a, b);
      a = a - m;
      b = b - m;
      q0 = vec::fmadd(a, a, q0);
      q1 = vec::fmadd(b, b, q1);
    }
    sq = horizontal_sum(q0 + q1);
  }
  for (; j < n; ++j) {
    const acc_t d = static_cast<acc_t>(x[j]) - mean;
    sq += d * d;
  }
  return sq;
}

// Row statistics: (mean, rstd) for layer norm, (0, rstd) for RMS norm, from one pass
// that sums x and x^2. Layer norm's var = mean(x^2) - mean^2 then loses the digits that
// mean^2 shares with mean(x^2); while mean^2 <= mean(x^2) / 2, var keeps at least half
// of mean(x^2) and so loses at most one bit. Past that (large means, NaN, inf) a second
// pass sums the squares around the mean, which loses none.
template <bool rms, typename in_t, typename acc_t = acc_of<in_t>>
void row_stats(const in_t* x, int64_t n, double eps, acc_t& mean, acc_t& rstd) {
  acc_t sum = 0, sq = 0;
  int64_t j = 0;
  if constexpr (kVectorized<in_t>) {
    fVec s0(0.f), s1(0.f), q0(0.f), q1(0.f);
    for (; j + kWidth <= n; j += kWidth) {
      fVec a, b;
      load2(x + j, a, b);
      if constexpr (!rms) {
        s0 += a;
        s1 += b;
      }
      q0 = vec::fmadd(a, a, q0);
      q1 = vec::fmadd(b, b, q1);
    }
    sum = horizontal_sum(s0 + s1);
    sq = horizontal_sum(q0 + q1);
  }
  for (; j < n; ++j) {
    const acc_t v = static_cast<acc_t>(x[j]);
    sum += v;
    sq += v * v;
  }
  const acc_t count = static_cast<acc_t>(n);
  mean = rms ? acc_t(0) : sum / count;
  acc_t var = sq / count - mean * mean;
  if (!rms && !(mean * mean <= acc_t(0.5) * (sq / count))) var = centered_squares(x, n, mean) / count;
  rstd = acc_t(1) / std::sqrt(var + static_cast<acc_t>(eps));
}

// y = norm(x) * w + b for one row (w, b hold n values: ones / zeros when absent);
// stream: y is stored with streaming stores (stream_store.h).
template <bool rms, typename in_t, typename out_t, typename acc_t = acc_of<in_t>>
void row_out(const in_t* x, out_t* y, const acc_t* w, const acc_t* b, int64_t n, acc_t mean, acc_t rstd,
             bool stream) {
  int64_t j = 0;
  if constexpr (kVectorized<in_t> && kVectorized<out_t>) {
    const fVec m(mean), r(rstd);
    for (; j + kWidth <= n; j += kWidth) {
      fVec a0, a1, w0, w1, b0, b1;
      load2(x + j, a0, a1);
      load2(w + j, w0, w1);
      if constexpr (rms) {
        store2(y + j, rms_norm_out(a0, r, w0), rms_norm_out(a1, r, w1), stream);
      } else {
        load2(b + j, b0, b1);
        store2(y + j, layer_norm_out(a0, m, r, w0, b0), layer_norm_out(a1, m, r, w1, b1), stream);
      }
    }
  }
  for (; j < n; ++j) {
    const acc_t v = static_cast<acc_t>(x[j]);
    if constexpr (rms) {
      y[j] = static_cast<out_t>(rms_norm_out(v, rstd, w[j]));
    } else {
      y[j] = static_cast<out_t>(layer_norm_out(v, mean, rstd, w[j], b[j]));
    }
  }
}

Tensor3 norm_fwd(const Tensor& input, const OptionalTensor& weight, const OptionalTensor& bias, int64_t hidden,
                 double eps, std::optional<ScalarType> out_dtype, bool rms) {
  // Arguments checked by the op's entry point (norm_args.h layer_norm_fwd / rms_norm_fwd).
  const Tensor x = core_ops::contiguous(input);
  const int64_t rows = hidden > 0 ? x.numel() / hidden : 0;
  const ScalarType in = dtype_of(x);
  const ScalarType out_type = out_dtype.value_or(in);
  const ScalarType acc = in == ScalarType::Double ? ScalarType::Double : ScalarType::Float;
  Tensor out = core_ops::empty(input.sizes(), out_type, x.device());
  Tensor mean = core_ops::empty({rows}, acc, x.device());
  Tensor rstd = core_ops::empty({rows}, acc, x.device());
  if (rows == 0) return {out, mean, rstd};
  const Tensor w = acc_param(weight, hidden, acc, 1, x), b = acc_param(bias, hidden, acc, 0, x);
  CORE_OPS_DISPATCH_FLOATING(in, "input", scalar_t, [&] {
    using in_t = scalar_t;
    using acc_t = acc_of<in_t>;
    const auto run = [&](auto* y_base) {
      const in_t* xp = data<const in_t>(x);
      acc_t *mp = data<acc_t>(mean), *rp = data<acc_t>(rstd);
      const acc_t *wp = data<const acc_t>(w), *bp = data<const acc_t>(b);
      const bool stream = stream_rows(y_base, rows, hidden);
      const auto rows_of = [&](auto is_rms) {
        constexpr bool R = decltype(is_rms)::value;
        const int64_t grain = std::max<int64_t>(1, kSerialBelow / hidden);
        torch::stable::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) {
            row_stats<R>(xp + r * hidden, hidden, eps, mp[r], rp[r]);
            row_out<R>(xp + r * hidden, y_base + r * hidden, wp, bp, hidden, mp[r], rp[r], stream);
          }
          if (stream) stream_fence();
        });
      };
      bool_switch(rms, rows_of);
    };
    if (out_type == in) {
      run(data<in_t>(out));
    } else {
      CORE_OPS_CHECK_TYPE(out_type == ScalarType::Float && in != ScalarType::Double,
                          "out_dtype must be the input's dtype or, for half input, torch.float32; got ",
                          core_ops::dtype_name(out_type));
      run(data<float>(out));
    }
  }());
  return {out, mean, rstd};
}

// One row of backward. saved is x (or y when memory_efficient); dy and y are out_t, x
// and dx in_t. Adds dy * xhat into dw and dy into db (the block's buffers).
template <bool rms, bool from_out, bool affine, typename in_t, typename out_t, typename saved_t,
          typename acc_t = acc_of<in_t>>
void row_backward(const out_t* dy, const saved_t* s, in_t* dx, const acc_t* w, const acc_t* b, int64_t n, acc_t mean,
                  acc_t rstd, acc_t* dw, acc_t* db, bool stream) {
  // xhat of element j, from the input or from the output.
  const auto xhat = [&](auto v, auto wj, auto bj) {
    using V = decltype(v);
    if constexpr (from_out && !affine) {
      return v;
    } else if constexpr (from_out && rms) {
      return V(v / wj);
    } else if constexpr (from_out) {
      return V(layer_norm_xhat_from_out(v, wj, bj));
    } else if constexpr (rms) {
      return V(v * V(rstd));
    } else {
      return V((v - V(mean)) * V(rstd));
    }
  };
  // Pass 1: the row sums of g = dy * w and g * xhat. Pass 2: dx, and dy * xhat and dy
  // into the block's weight / bias grad buffers. The bias is read only where xhat
  // needs it (from the output of an affine layer norm).
  constexpr bool needs_b = from_out && affine && !rms;
  acc_t sum_g = 0, sum_gx = 0;
  int64_t j = 0;
  constexpr bool vec = kVectorized<in_t> && kVectorized<out_t> && kVectorized<saved_t>;
  if constexpr (vec) {
    fVec g0(0.f), g1(0.f), h0(0.f), h1(0.f), b0(0.f), b1(0.f);
    for (; j + kWidth <= n; j += kWidth) {
      fVec d0, d1, v0, v1, w0, w1;
      load2(dy + j, d0, d1);
      load2(s + j, v0, v1);
      load2(w + j, w0, w1);
      if constexpr (needs_b) load2(b + j, b0, b1);
      const fVec gg0 = d0 * w0, gg1 = d1 * w1;
      g0 += gg0;
      g1 += gg1;
      h0 = vec::fmadd(gg0, xhat(v0, w0, b0), h0);
      h1 = vec::fmadd(gg1, xhat(v1, w1, b1), h1);
    }
    sum_g = horizontal_sum(g0 + g1);
    sum_gx = horizontal_sum(h0 + h1);
  }
  for (int64_t k = j; k < n; ++k) {
    const acc_t g = static_cast<acc_t>(dy[k]) * w[k];
    sum_g += g;
    sum_gx += g * xhat(static_cast<acc_t>(s[k]), w[k], b[k]);
  }
  const acc_t inv_n = acc_t(1) / static_cast<acc_t>(n);
  const acc_t mean_g = rms ? acc_t(0) : sum_g * inv_n, mean_gx = sum_gx * inv_n;
  j = 0;
  if constexpr (vec) {
    const fVec r(rstd), mg(mean_g), mgx(mean_gx);
    fVec b0(0.f), b1(0.f);
    for (; j + kWidth <= n; j += kWidth) {
      fVec d0, d1, v0, v1, w0, w1, a0, a1, c0, c1;
      load2(dy + j, d0, d1);
      load2(s + j, v0, v1);
      load2(w + j, w0, w1);
      if constexpr (needs_b) load2(b + j, b0, b1);
      const fVec x0 = xhat(v0, w0, b0), x1 = xhat(v1, w1, b1);
      store2(dx + j, layer_norm_dx(d0 * w0, x0, r, mg, mgx), layer_norm_dx(d1 * w1, x1, r, mg, mgx), stream);
      load2(dw + j, a0, a1);
      VecIO<float>::store(dw + j, vec::fmadd(d0, x0, a0), vec::fmadd(d1, x1, a1));
      if constexpr (!rms) {  // RMS norm has no bias
        load2(db + j, c0, c1);
        VecIO<float>::store(db + j, c0 + d0, c1 + d1);
      }
    }
  }
  for (; j < n; ++j) {
    const acc_t d = static_cast<acc_t>(dy[j]);
    const acc_t xh = xhat(static_cast<acc_t>(s[j]), w[j], b[j]);
    dx[j] = static_cast<in_t>(layer_norm_dx(d * w[j], xh, rstd, mean_g, mean_gx));
    dw[j] += d * xh;
    if constexpr (!rms) db[j] += d;
  }
}

Tensor3 norm_bwd(const Tensor& grad_out, const Tensor& saved, const Tensor& mean, const Tensor& rstd,
                 const OptionalTensor& weight, const OptionalTensor& bias, int64_t hidden, bool memory_efficient,
                 ScalarType dx_dtype, bool rms) {
  // Arguments checked by the op's entry point (norm_args.h layer_norm_bwd / rms_norm_bwd).
  const Tensor dy = core_ops::contiguous(grad_out), s = core_ops::contiguous(saved);
  const int64_t rows = hidden > 0 ? s.numel() / hidden : 0;
  const ScalarType acc = dx_dtype == ScalarType::Double ? ScalarType::Double : ScalarType::Float;
  Tensor dx = core_ops::empty(saved.sizes(), dx_dtype, s.device());
  if (rows == 0) return no_rows_backward(dx, weight, bias, s);
  const Tensor w = acc_param(weight, hidden, acc, 1, s), b = acc_param(bias, hidden, acc, 0, s);
  // From the output, xhat undoes the affine map: a bias alone shifts it too.
  const bool affine = weight.has_value() || (!rms && bias.has_value());
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>({rows, int64_t(torch::stable::get_num_threads()),
                                                                  std::max<int64_t>(1, rows * hidden / kSerialBelow)}));
  Tensor partial = core_ops::zeros({blocks, 2, hidden}, acc, s.device());
  const Tensor m = rms ? rstd : core_ops::contiguous(mean), r = core_ops::contiguous(rstd);
  if (rows > 0) {
    CORE_OPS_DISPATCH_FLOATING(dx_dtype, "dx_dtype", scalar_t, [&] {
      using in_t = scalar_t;
      using acc_t = acc_of<in_t>;
      const auto run = [&](const auto* dyp, const auto* sp) {
        in_t* dxp = data<in_t>(dx);
        const acc_t *wp = data<const acc_t>(w), *bp = data<const acc_t>(b);
        const acc_t *mp = data<const acc_t>(m), *rp = data<const acc_t>(r);
        acc_t* pp = data<acc_t>(partial);
        const bool stream = stream_rows(dxp, rows, hidden);
        torch::stable::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
          for (int64_t blk = b0; blk < b1; ++blk) {
            acc_t* dwp = pp + blk * 2 * hidden;
            const auto run_rows = [&](auto is_rms, auto from_out, auto has_weight) {
              constexpr bool R = decltype(is_rms)::value, O = decltype(from_out)::value,
                             A = decltype(has_weight)::value;
              for (int64_t row = rows * blk / blocks; row < rows * (blk + 1) / blocks; ++row) {
                row_backward<R, O, A, in_t>(dyp + row * hidden, sp + row * hidden, dxp + row * hidden, wp, bp,
                                            hidden, R ? acc_t(0) : mp[row], rp[row], dwp, dwp + hidden, stream);
              }
            };
            bool_switch(rms, [&](auto R) {
              bool_switch(memory_efficient, [&](auto O) { bool_switch(affine, [&](auto A) { run_rows(R, O, A); }); });
            });
          }
          if (stream) stream_fence();
        });
      };
      const ScalarType out_type = dtype_of(dy);  // its pairing with dx_dtype: check_norm_bwd_args
      if (out_type == dx_dtype) {
        run(data<const in_t>(dy), data<const in_t>(s));
      } else if (memory_efficient) {
        run(data<const float>(dy), data<const float>(s));
      } else {
        run(data<const float>(dy), data<const in_t>(s));
      }
    }());
  }
  const std::vector<int64_t> over_blocks{0};  // summed in a fixed order
  const Tensor sums = blocks == 1 ? torch::stable::select(partial, 0, 0) : torch::stable::sum(partial, over_blocks);
  // Row i of sums (0: weight grad, 1: bias grad) in p's dtype and shape, or no values.
  const auto grad_of = [&](const OptionalTensor& p, int64_t i) {
    if (!p.has_value()) return core_ops::empty({0}, dtype_of(s), s.device());
    return torch::stable::reshape(torch::stable::to(torch::stable::select(sums, 0, i), dtype_of(*p)), p->sizes());
  };
  return {dx, grad_of(weight, 0), grad_of(bias, 1)};
}

// h = x + r for one row, rounded to in_t as the output h is (the norm then reads h).
template <typename in_t>
void add_row(const in_t* x, const in_t* r, in_t* h, int64_t n) {
  int64_t j = 0;
  if constexpr (kVectorized<in_t>) {
    for (; j + kWidth <= n; j += kWidth) {
      fVec a0, a1, b0, b1;
      load2(x + j, a0, a1);
      load2(r + j, b0, b1);
      VecIO<in_t>::store(h + j, a0 + b0, a1 + b1);
    }
  }
  for (; j < n; ++j) h[j] = static_cast<in_t>(static_cast<acc_of<in_t>>(x[j]) + static_cast<acc_of<in_t>>(r[j]));
}

// A row copied with streaming stores (the caller checked stream_rows).
template <typename T>
void stream_row(const T* src, T* dst, int64_t n) {
  int64_t j = 0;
  if constexpr (kVectorized<T>) {
    for (; j + kWidth <= n; j += kWidth) {
      fVec a, b;
      load2(src + j, a, b);
      stream_store(dst + j, a, b);
    }
  }
  for (; j < n; ++j) dst[j] = src[j];
}

Tensor3 fused_add_rms_norm_fwd(const Tensor& input, const Tensor& residual, const OptionalTensor& weight,
                               int64_t hidden, double eps,
                               bool /*memory_efficient: for autograd*/) {
  auto [x, res, y, h, rstd, w, rows] = add_rms_norm_io(input, residual, weight, hidden);
  if (rows == 0) return {y, h, rstd};
  CORE_OPS_DISPATCH_FLOATING(dtype_of(x), "input", scalar_t, [&] {
    using in_t = scalar_t;
    using acc_t = acc_of<in_t>;
    const in_t *xp = data<const in_t>(x), *rp = data<const in_t>(res);
    in_t *hp = data<in_t>(h), *yp = data<in_t>(y);
    acc_t* sp = data<acc_t>(rstd);
    const acc_t* wp = data<const acc_t>(w);
    // y and h are the same size and dtype, so both stream or neither.
    const bool stream = stream_rows(yp, rows, hidden) && stream_rows(hp, rows, hidden);
    torch::stable::parallel_for(0, rows, std::max<int64_t>(1, kSerialBelow / hidden), [&](int64_t r0, int64_t r1) {
      // One pass over x and r from memory; the norm then reads the row of h from
      // cache: from h itself, or from a scratch row when h is streamed (a streamed
      // row is not in cache).
      std::vector<in_t> scratch(stream ? hidden : 0);
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t o = r * hidden;
        in_t* hr = stream ? scratch.data() : hp + o;
        add_row(xp + o, rp + o, hr, hidden);
        acc_t mean = 0;
        row_stats<true>(hr, hidden, eps, mean, sp[r]);
        row_out<true>(hr, yp + o, wp, wp, hidden, acc_t(0), sp[r], stream);
        if (stream) stream_row(hr, hp + o, hidden);
      }
      if (stream) stream_fence();
    });
  }());
  return {y, h, rstd};
}

}  // namespace
}  // namespace norms
CORE_OPS_CPU_END

CORE_OPS_CPU_KERNELS(m) {
  using namespace core_ops::cpu::norms;
  core_ops::register_norm_kernels<&norm_fwd, &norm_bwd, &fused_add_rms_norm_fwd>(m);
}
