// CPU kernels of the sync batch-norm ops (Note [Sync batch norm ops] in _schemas.py):
// the math is core_ops/welford_math.h; this file moves memory.
//
// Note [Sync batch norm layouts]: input (N, C, *) is read in place in one of two
// layouts. "Planes" (contiguous input): N * C runs of L = prod(*) values, one channel
// each; reductions go over channels in parallel, vectorized along each run.
// "Rows" (channels-last input, or 2-D (N, C)): N * L rows of C channels; reductions
// split the rows into one block per thread, vectorized across channels, and merge
// the blocks in a fixed order (deterministic). Any other strides are copied to planes
// first. Outputs take input's strides (empty_like), as the fake kernels promise.
#include <algorithm>
#include <array>
#include <type_traits>
#include <vector>

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>

#include <core_ops/dispatch.h>
#include <core_ops/sync_batch_norm_args.h>
#include <core_ops/tensor.h>
#include <core_ops/welford_math.h>

#include "level.h"
#include "multi_tensor_apply.h"

CORE_OPS_CPU_BEGIN
namespace {

// Rows [r0, r1) split evenly into one block per thread (at most), in a fixed order.
template <typename F>
void for_row_blocks(int64_t rows, int64_t cols, int64_t blocks, const F& f) {
  torch::stable::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) f(b, rows * b / blocks, rows * (b + 1) / blocks);
  });
}

// f(ch) for every channel of a planes layout, channels split across threads (a
// thread takes enough channels to make kSerialBelow elements of work).
template <typename F>
void for_each_channel(const Layout& lay, const F& f) {
  const int64_t grain = std::max<int64_t>(1, kSerialBelow / std::max<int64_t>(1, lay.n * lay.l));
  torch::stable::parallel_for(0, lay.c, grain, [&](int64_t c0, int64_t c1) {
    for (int64_t ch = c0; ch < c1; ++ch) f(ch);
  });
}

int64_t row_blocks(int64_t rows, int64_t cols) {
  const int64_t by_size = std::max<int64_t>(1, rows * cols / kSerialBelow);
  return std::max<int64_t>(1, std::min({rows, by_size, int64_t(torch::stable::get_num_threads())}));
}

// --- statistics -------------------------------------------------------------------

// Note [Folded accumulation]: float vector lanes accumulate at most kFold steps, then
// are folded into double accumulators (Welford's merge, or a sum). A float Welford or
// sum running over a whole channel (up to millions of values) loses ~n * 2^-24 in the
// worst case; folding keeps the error at that of kFold values plus one float rounding
// of the double result, below torch's own BatchNorm error, for the cost of one merge
// per kFold vectors.
constexpr int64_t kFold = 64;

template <typename scalar_t>
void plane_stats(const scalar_t* x, int64_t n, int64_t stride, int64_t l, double& mean, double& var) {
  double m = 0, q = 0, k = 0;
  int64_t i_vec = 0;
  if constexpr (kVectorized<scalar_t>) {
    fVec ma(0.f), mb(0.f), qa(0.f), qb(0.f);
    float kv = 0;  // every lane has seen kv values since the last fold
    const auto fold = [&] {
      float lm[kWidth], lq[kWidth];
      ma.store(lm);
      mb.store(lm + fVec::size());
      qa.store(lq);
      qb.store(lq + fVec::size());
      for (int64_t j = 0; j < kWidth; ++j) welford_combine<double>(m, q, k, lm[j], lq[j], kv);
      ma = mb = qa = qb = fVec(0.f);
      kv = 0;
    };
    i_vec = l - l % kWidth;
    for (int64_t r = 0; r < n; ++r) {
      const scalar_t* row = x + r * stride;
      for (int64_t i = 0; i < i_vec; i += kWidth) {
        kv += 1;
        const fVec inv(1.f / kv);
        fVec a, b;
        VecIO<scalar_t>::load(row + i, a, b);
        welford_update(ma, qa, a, inv);
        welford_update(mb, qb, b, inv);
        if (kv == kFold) fold();
      }
    }
    fold();
  }
  double mt = 0, qt = 0, kt = 0;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = i_vec; i < l; ++i) {
      kt += 1;
      welford_update(mt, qt, static_cast<double>(x[r * stride + i]), 1.0 / kt);
    }
  }
  welford_combine(m, q, k, mt, qt, kt);
  mean = m;
  var = k > 0 ? q / k : 0.0;
}

// Rows [r0, r1) of c channels into double (mean, m2) per channel, through float (or
// double) scratch arrays folded every kFold rows (Note [Folded accumulation]).
template <typename scalar_t, typename acc_t = acc_of<scalar_t>>
void row_stats(const scalar_t* x, int64_t r0, int64_t r1, int64_t c, double* mean, double* m2) {
  std::fill(mean, mean + c, 0.0);
  std::fill(m2, m2 + c, 0.0);
  std::vector<acc_t> sm(c), sq(c);
  double count = 0;
  for (int64_t f0 = r0; f0 < r1; f0 += kFold) {
    const int64_t f1 = std::min(r1, f0 + kFold);
    std::fill(sm.begin(), sm.end(), acc_t(0));
    std::fill(sq.begin(), sq.end(), acc_t(0));
    for (int64_t r = f0; r < f1; ++r) {
      const acc_t inv = acc_t(1) / acc_t(r - f0 + 1);
      const scalar_t* row = x + r * c;
      int64_t j = 0;
      if constexpr (kVectorized<scalar_t>) {
        const fVec vinv(inv);
        for (; j + kWidth <= c; j += kWidth) {
          fVec a, b, ma, mb, qa, qb;
          VecIO<scalar_t>::load(row + j, a, b);
          VecIO<float>::load(sm.data() + j, ma, mb);
          VecIO<float>::load(sq.data() + j, qa, qb);
          welford_update(ma, qa, a, vinv);
          welford_update(mb, qb, b, vinv);
          VecIO<float>::store(sm.data() + j, ma, mb);
          VecIO<float>::store(sq.data() + j, qa, qb);
        }
      }
      for (; j < c; ++j) welford_update(sm[j], sq[j], static_cast<acc_t>(row[j]), inv);
    }
    const double n_fold = double(f1 - f0);
    for (int64_t j = 0; j < c; ++j) {
      double k = count;
      welford_combine<double>(mean[j], m2[j], k, sm[j], sq[j], n_fold);
    }
    count += n_fold;
  }
}

std::tuple<Tensor, Tensor> sync_batch_norm_stats(const Tensor& input) {
  check_batch_norm_args(input, nullptr, {}, std::nullopt, std::nullopt);
  const auto acc = dtype_of(input) == ScalarType::Double ? ScalarType::Double : ScalarType::Float;
  Tensor mean = core_ops::empty({input.size(1)}, acc, input.device());
  Tensor var = core_ops::empty_like(mean);
  const Layout lay = layout_of(input, reads_rows(input));
  CORE_OPS_DISPATCH_FLOATING(dtype_of(input), "input", scalar_t, [&] {
    using acc_t = acc_of<scalar_t>;
    const scalar_t* x = data<const scalar_t>(lay.data);
    acc_t* pm = data<acc_t>(mean);
    acc_t* pv = data<acc_t>(var);
    if (!lay.rows) {
      for_each_channel(lay, [&](int64_t ch) {
        double m, v;
        plane_stats(x + ch * lay.l, lay.n, lay.c * lay.l, lay.l, m, v);
        pm[ch] = static_cast<acc_t>(m);
        pv[ch] = static_cast<acc_t>(v);
      });
      return;
    }
    const int64_t rows = lay.n * lay.l, c = lay.c, blocks = row_blocks(rows, c);
    std::vector<double> bm(blocks * c), bq(blocks * c);
    for_row_blocks(rows, c, blocks, [&](int64_t b, int64_t r0, int64_t r1) {
      row_stats(x, r0, r1, c, bm.data() + b * c, bq.data() + b * c);
    });
    for (int64_t ch = 0; ch < c; ++ch) {
      double m = 0, q = 0, k = 0;
      for (int64_t b = 0; b < blocks; ++b) {
        welford_combine(m, q, k, bm[b * c + ch], bq[b * c + ch], double(rows * (b + 1) / blocks - rows * b / blocks));
      }
      pm[ch] = static_cast<acc_t>(m);
      pv[ch] = static_cast<acc_t>(k > 0 ? q / k : 0.0);
    }
  }());
  return {mean, var};
}

// --- backward reduction -------------------------------------------------------------

// Sums in float vector lanes folded into double every kFold vectors (Note [Folded
// accumulation]); the scalar tail in double.
template <typename scalar_t, typename acc_t = acc_of<scalar_t>>
void plane_sums(const scalar_t* dy, const scalar_t* x, int64_t n, int64_t stride, int64_t l,
                acc_t mean, double& sum_dy, double& sum_dy_xmu) {
  double s = 0, t = 0;
  int64_t i_vec = 0;
  if constexpr (kVectorized<scalar_t>) {
    fVec sa(0.f), sb(0.f), ta(0.f), tb(0.f);
    const fVec vm(mean);
    int64_t steps = 0;
    i_vec = l - l % kWidth;
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t i = 0; i < i_vec; i += kWidth) {
        fVec ga, gb, xa, xb;
        VecIO<scalar_t>::load(dy + r * stride + i, ga, gb);
        VecIO<scalar_t>::load(x + r * stride + i, xa, xb);
        sa = sa + ga;
        sb = sb + gb;
        ta = ta + ga * (xa - vm);
        tb = tb + gb * (xb - vm);
        if (++steps == kFold) {
          s += horizontal_sum(sa + sb);
          t += horizontal_sum(ta + tb);
          sa = sb = ta = tb = fVec(0.f);
          steps = 0;
        }
      }
    }
    s += horizontal_sum(sa + sb);
    t += horizontal_sum(ta + tb);
  }
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = i_vec; i < l; ++i) {
      const double g = static_cast<double>(dy[r * stride + i]);
      s += g;
      t += g * (static_cast<double>(static_cast<acc_t>(x[r * stride + i]) - mean));
    }
  }
  sum_dy = s;
  sum_dy_xmu = t;
}

template <typename scalar_t, typename acc_t = acc_of<scalar_t>>
void row_sums(const scalar_t* dy, const scalar_t* x, int64_t r0, int64_t r1, int64_t c,
              const acc_t* mean, double* s, double* t) {
  std::fill(s, s + c, 0.0);
  std::fill(t, t + c, 0.0);
  std::vector<acc_t> fs(c), ft(c);
  for (int64_t f0 = r0; f0 < r1; f0 += kFold) {
    std::fill(fs.begin(), fs.end(), acc_t(0));
    std::fill(ft.begin(), ft.end(), acc_t(0));
    for (int64_t r = f0; r < std::min(r1, f0 + kFold); ++r) {
      int64_t j = 0;
      if constexpr (kVectorized<scalar_t>) {
        for (; j + kWidth <= c; j += kWidth) {
          fVec ga, gb, xa, xb, ma, mb, sa, sb, ta, tb;
          VecIO<scalar_t>::load(dy + r * c + j, ga, gb);
          VecIO<scalar_t>::load(x + r * c + j, xa, xb);
          VecIO<float>::load(mean + j, ma, mb);
          VecIO<float>::load(fs.data() + j, sa, sb);
          VecIO<float>::load(ft.data() + j, ta, tb);
          VecIO<float>::store(fs.data() + j, sa + ga, sb + gb);
          VecIO<float>::store(ft.data() + j, ta + ga * (xa - ma), tb + gb * (xb - mb));
        }
      }
      for (; j < c; ++j) {
        const acc_t g = static_cast<acc_t>(dy[r * c + j]);
        fs[j] += g;
        ft[j] += g * (static_cast<acc_t>(x[r * c + j]) - mean[j]);
      }
    }
    for (int64_t j = 0; j < c; ++j) {
      s[j] += fs[j];
      t[j] += ft[j];
    }
  }
}

std::tuple<Tensor, Tensor> sync_batch_norm_backward_reduce(const Tensor& grad_out, const Tensor& input,
                                                           const Tensor& mean) {
  check_batch_norm_args(input, &grad_out, {{"mean", &mean}}, std::nullopt, std::nullopt);
  Tensor sum_dy = core_ops::empty_like(mean), sum_dy_xmu = core_ops::empty_like(mean);
  const bool rows = reads_rows(input);
  const Layout lay = layout_of(input, rows), g = layout_of(grad_out, rows);
  const Tensor m = core_ops::contiguous(mean);
  CORE_OPS_DISPATCH_FLOATING(dtype_of(input), "input", scalar_t, [&] {
    using acc_t = acc_of<scalar_t>;
    const scalar_t* x = data<const scalar_t>(lay.data);
    const scalar_t* dy = data<const scalar_t>(g.data);
    const acc_t* pm = data<const acc_t>(m);
    acc_t* ps = data<acc_t>(sum_dy);
    acc_t* pt = data<acc_t>(sum_dy_xmu);
    if (!lay.rows) {
      for_each_channel(lay, [&](int64_t ch) {
        double sd, sx;
        plane_sums(dy + ch * lay.l, x + ch * lay.l, lay.n, lay.c * lay.l, lay.l, pm[ch], sd, sx);
        ps[ch] = static_cast<acc_t>(sd);
        pt[ch] = static_cast<acc_t>(sx);
      });
      return;
    }
    const int64_t rows_n = lay.n * lay.l, c = lay.c, blocks = row_blocks(rows_n, c);
    std::vector<double> bs(blocks * c), bt(blocks * c);
    for_row_blocks(rows_n, c, blocks, [&](int64_t b, int64_t r0, int64_t r1) {
      row_sums(dy, x, r0, r1, c, pm, bs.data() + b * c, bt.data() + b * c);
    });
    for (int64_t ch = 0; ch < c; ++ch) {
      double s = 0, t = 0;
      for (int64_t b = 0; b < blocks; ++b) {
        s += bs[b * c + ch];
        t += bt[b * c + ch];
      }
      ps[ch] = static_cast<acc_t>(s);
      pt[ch] = static_cast<acc_t>(t);
    }
  }());
  return {sum_dy, sum_dy_xmu};
}

// --- elementwise ----------------------------------------------------------------------

// out = f(x, dy, per-channel constants p[0..3][c]) over the layout; F takes and returns
// fVec (float types) or acc_t, with the constants of its channel(s).
template <typename scalar_t, typename acc_t, typename F>
void elementwise(const Layout& lay, const scalar_t* x, const scalar_t* dy, scalar_t* out,
                 const std::array<const acc_t*, 4>& p, const F& f) {
  if (!lay.rows) {
    const int64_t grain = std::max<int64_t>(1, kChunk / std::max<int64_t>(1, lay.l));
    torch::stable::parallel_for(0, lay.n * lay.c, grain, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t ch = r % lay.c, base = r * lay.l;
        int64_t i = 0;
        if constexpr (kVectorized<scalar_t>) {
          const fVec c0(p[0][ch]), c1(p[1][ch]), c2(p[2][ch]), c3(p[3][ch]);
          for (; i + kWidth <= lay.l; i += kWidth) {
            fVec xa, xb, ga(0.f), gb(0.f);
            VecIO<scalar_t>::load(x + base + i, xa, xb);
            if (dy != nullptr) VecIO<scalar_t>::load(dy + base + i, ga, gb);
            VecIO<scalar_t>::store(out + base + i, f(xa, ga, c0, c1, c2, c3), f(xb, gb, c0, c1, c2, c3));
          }
        }
        for (; i < lay.l; ++i) {
          const acc_t g = dy != nullptr ? static_cast<acc_t>(dy[base + i]) : acc_t(0);
          out[base + i] = static_cast<scalar_t>(
              f(static_cast<acc_t>(x[base + i]), g, p[0][ch], p[1][ch], p[2][ch], p[3][ch]));
        }
      }
    });
    return;
  }
  const int64_t c = lay.c;
  const int64_t grain = std::max<int64_t>(1, kChunk / std::max<int64_t>(1, c));
  torch::stable::parallel_for(0, lay.n * lay.l, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t base = r * c;
      int64_t j = 0;
      if constexpr (kVectorized<scalar_t>) {
        for (; j + kWidth <= c; j += kWidth) {
          fVec xa, xb, ga(0.f), gb(0.f), a0, b0, a1, b1, a2, b2, a3, b3;
          VecIO<scalar_t>::load(x + base + j, xa, xb);
          if (dy != nullptr) VecIO<scalar_t>::load(dy + base + j, ga, gb);
          VecIO<float>::load(p[0] + j, a0, b0);
          VecIO<float>::load(p[1] + j, a1, b1);
          VecIO<float>::load(p[2] + j, a2, b2);
          VecIO<float>::load(p[3] + j, a3, b3);
          VecIO<scalar_t>::store(out + base + j, f(xa, ga, a0, a1, a2, a3), f(xb, gb, b0, b1, b2, b3));
        }
      }
      for (; j < c; ++j) {
        const acc_t g = dy != nullptr ? static_cast<acc_t>(dy[base + j]) : acc_t(0);
        out[base + j] = static_cast<scalar_t>(f(static_cast<acc_t>(x[base + j]), g, p[0][j], p[1][j], p[2][j], p[3][j]));
      }
    }
  });
}

// The per-channel constants are computed as the reference computes them with tensor
// ops, each product rounded once in the accumulation dtype: a weight or bias is first
// converted to it (its values contiguous), then scale = invstd * weight.
OptionalTensor acc_values(const OptionalTensor& t, ScalarType acc) {
  if (!t.has_value()) return std::nullopt;
  return core_ops::contiguous(torch::stable::to(*t, acc));
}

template <typename acc_t>
std::vector<acc_t> times_weight(const acc_t* invstd, const OptionalTensor& weight, int64_t c) {
  std::vector<acc_t> out(invstd, invstd + c);
  if (weight.has_value()) {
    const acc_t* w = data<const acc_t>(*weight);
    for (int64_t ch = 0; ch < c; ++ch) out[ch] = invstd[ch] * w[ch];
  }
  return out;
}

Tensor sync_batch_norm_elemt(const Tensor& input, const Tensor& mean, const Tensor& invstd, const OptionalTensor& weight,
                             const OptionalTensor& bias) {
  check_batch_norm_args(input, nullptr, {{"mean", &mean}, {"invstd", &invstd}}, weight, bias);
  const Tensor inv = core_ops::contiguous(invstd), m = core_ops::contiguous(mean);
  const OptionalTensor w = acc_values(weight, dtype_of(invstd)), b = acc_values(bias, dtype_of(invstd));
  const Layout lay = layout_of(input, reads_rows(input));
  Tensor out = empty_in(lay, input);
  CORE_OPS_DISPATCH_FLOATING(dtype_of(input), "input", scalar_t, [&] {
    using acc_t = acc_of<scalar_t>;
    const int64_t c = lay.c;
    const std::vector<acc_t> scale = times_weight(data<const acc_t>(inv), w, c);
    std::vector<acc_t> shift(c, acc_t(0));
    if (b.has_value()) std::copy_n(data<const acc_t>(*b), c, shift.begin());
    const std::array<const acc_t*, 4> p{data<const acc_t>(m), scale.data(), shift.data(), shift.data()};
    elementwise<scalar_t, acc_t>(lay, data<const scalar_t>(lay.data), nullptr, data<scalar_t>(out), p,
                                 [](auto x, auto, auto mu, auto s, auto b, auto) {
                                   return batch_norm_elemt_math(x, mu, s, b);
                                 });
  }());
  return with_input_strides(out, input);
}

Tensor sync_batch_norm_backward_elemt(const Tensor& grad_out, const Tensor& input, const Tensor& mean,
                                      const Tensor& invstd, const OptionalTensor& weight, const Tensor& mean_dy,
                                      const Tensor& mean_dy_xmu) {
  check_batch_norm_args(input, &grad_out,
             {{"mean", &mean}, {"invstd", &invstd}, {"mean_dy", &mean_dy}, {"mean_dy_xmu", &mean_dy_xmu}},
             weight, std::nullopt);
  const Tensor inv = core_ops::contiguous(invstd), m = core_ops::contiguous(mean), mdy = core_ops::contiguous(mean_dy);
  const Tensor mdxm = core_ops::contiguous(mean_dy_xmu);
  const OptionalTensor w = acc_values(weight, dtype_of(invstd));
  const bool rows = reads_rows(input);
  const Layout lay = layout_of(input, rows), g = layout_of(grad_out, rows);
  Tensor out = empty_in(lay, input);
  CORE_OPS_DISPATCH_FLOATING(dtype_of(input), "input", scalar_t, [&] {
    using acc_t = acc_of<scalar_t>;
    const int64_t c = lay.c;
    const acc_t* pi = data<const acc_t>(inv);
    const acc_t* px = data<const acc_t>(mdxm);
    const std::vector<acc_t> scale = times_weight(pi, w, c);
    std::vector<acc_t> k(c);
    for (int64_t ch = 0; ch < c; ++ch) k[ch] = pi[ch] * pi[ch] * px[ch];  // invstd.mul(invstd).mul(mean_dy_xmu)
    const std::array<const acc_t*, 4> p{data<const acc_t>(m), data<const acc_t>(mdy), k.data(), scale.data()};
    elementwise<scalar_t, acc_t>(lay, data<const scalar_t>(lay.data), data<const scalar_t>(g.data),
                                 data<scalar_t>(out), p,
                                 [](auto x, auto dy, auto mu, auto mdy_, auto k_, auto s) {
                                   return batch_norm_backward_elemt_math(dy, x, mu, mdy_, k_, s);
                                 });
  }());
  return with_input_strides(out, input);
}

}  // namespace
CORE_OPS_CPU_END

CORE_OPS_CPU_KERNELS(m) {
  m.impl("sync_batch_norm_stats", TORCH_BOX(&sync_batch_norm_stats));
  m.impl("sync_batch_norm_elemt", TORCH_BOX(&sync_batch_norm_elemt));
  m.impl("sync_batch_norm_backward_reduce", TORCH_BOX(&sync_batch_norm_backward_reduce));
  m.impl("sync_batch_norm_backward_elemt", TORCH_BOX(&sync_batch_norm_backward_elemt));
}
