// The inner loops of the CPU multi-tensor ops: one chunk of contiguous memory, in
// vectors of kWidth elements and a scalar tail. The per-element math comes from
// core_ops/multi_tensor_math.h, so these loops only move memory.
#pragma once

#include <core_ops/multi_tensor_math.h>

#include "level.h"
#include "multi_tensor_apply.h"

CORE_OPS_CPU_BEGIN

// What one chunk reports: the non-finite probe (Note [Non-finite probe]) and the sum
// of squares of the mapped values.
template <typename acc_t>
struct ChunkStats {
  acc_t probe = 0;
  acc_t sumsq = 0;
  bool nonfinite() const { return !(probe == probe); }
};

// y = f(x) over one chunk; kWrite stores y, kProbe checks x, kReduce sums y*y.
// acc_t is the compute type: float for float/half/bfloat16, double for double.
template <bool kWrite, bool kProbe, bool kReduce, typename acc_t, typename in_t,
          typename out_t, typename F>
void map_scalar(const in_t* x, out_t* y, int64_t begin, int64_t end, const F& f,
                ChunkStats<acc_t>& st) {
  for (int64_t i = begin; i < end; ++i) {
    const acc_t v = static_cast<acc_t>(x[i]);
    const acc_t r = f(v);
    if constexpr (kProbe) st.probe += nonfinite_probe(v);
    if constexpr (kReduce) st.sumsq += square_math(r);
    if constexpr (kWrite) y[i] = static_cast<out_t>(r);
  }
}

template <bool kWrite, bool kProbe, bool kReduce, typename in_t, typename out_t, typename F>
ChunkStats<float> map_chunk(const in_t* x, out_t* y, int64_t n, const F& f) {
  fVec probe(0.f), sum0(0.f), sum1(0.f), sum2(0.f), sum3(0.f);
  int64_t i = 0;
  if constexpr ((kReduce || kProbe) && !kWrite) {
    // Note [Read streams]: a read-only pass over one contiguous stream is limited by
    // the cache misses a core keeps in flight (~16 GB/s on the 2-core EPYC here).
    // Reading the four quarters of the chunk side by side keeps four prefetch streams
    // busy: l2norm of 80 MB in 3.9 ms instead of 5.8 (bench/README.md). The order of
    // the sums depends only on the chunk, so results stay thread-count independent.
    const int64_t q = n / (4 * kWidth) * kWidth;
    for (int64_t j = 0; j < q; j += kWidth) {
      fVec a0, b0, a1, b1, a2, b2, a3, b3;
      VecIO<in_t>::load(x + j, a0, b0);
      VecIO<in_t>::load(x + q + j, a1, b1);
      VecIO<in_t>::load(x + 2 * q + j, a2, b2);
      VecIO<in_t>::load(x + 3 * q + j, a3, b3);
      if constexpr (kProbe) {
        probe = probe + (nonfinite_probe(a0) + nonfinite_probe(b0)) +
                (nonfinite_probe(a1) + nonfinite_probe(b1)) +
                (nonfinite_probe(a2) + nonfinite_probe(b2)) +
                (nonfinite_probe(a3) + nonfinite_probe(b3));
      }
      if constexpr (kReduce) {
        sum0 = sum0 + (square_math(f(a0)) + square_math(f(b0)));
        sum1 = sum1 + (square_math(f(a1)) + square_math(f(b1)));
        sum2 = sum2 + (square_math(f(a2)) + square_math(f(b2)));
        sum3 = sum3 + (square_math(f(a3)) + square_math(f(b3)));
      }
    }
    i = 4 * q;
  }
  if constexpr (kReduce) {
    // Four independent accumulators: one chain of vector adds is latency-bound
    // below the memory bandwidth of a single core.
    for (; i + 2 * kWidth <= n; i += 2 * kWidth) {
      fVec a, b, c, d;
      VecIO<in_t>::load(x + i, a, b);
      VecIO<in_t>::load(x + i + kWidth, c, d);
      if constexpr (kProbe) {
        probe = probe + (nonfinite_probe(a) + nonfinite_probe(b)) +
                (nonfinite_probe(c) + nonfinite_probe(d));
      }
      const fVec ra = f(a), rb = f(b), rc = f(c), rd = f(d);
      sum0 = sum0 + square_math(ra);
      sum1 = sum1 + square_math(rb);
      sum2 = sum2 + square_math(rc);
      sum3 = sum3 + square_math(rd);
      if constexpr (kWrite) {
        VecIO<out_t>::store(y + i, ra, rb);
        VecIO<out_t>::store(y + i + kWidth, rc, rd);
      }
    }
  }
  for (; i + kWidth <= n; i += kWidth) {
    fVec a, b;
    VecIO<in_t>::load(x + i, a, b);
    if constexpr (kProbe) probe = probe + nonfinite_probe(a) + nonfinite_probe(b);
    const fVec ra = f(a), rb = f(b);
    if constexpr (kReduce) {
      sum0 = sum0 + square_math(ra);
      sum1 = sum1 + square_math(rb);
    }
    if constexpr (kWrite) VecIO<out_t>::store(y + i, ra, rb);
  }
  ChunkStats<float> st;
  map_scalar<kWrite, kProbe, kReduce>(x, y, i, n, f, st);
  if constexpr (kProbe) st.probe += horizontal_sum(probe);
  if constexpr (kReduce) st.sumsq += horizontal_sum((sum0 + sum1) + (sum2 + sum3));
  return st;
}

// out = a*x + b*y over one chunk, probing x and y separately.
struct AxpbyStats {
  bool x_nonfinite = false;
  bool y_nonfinite = false;
};

template <typename acc_t, typename x_t, typename y_t, typename out_t>
void axpby_scalar(const x_t* x, const y_t* y, out_t* out, int64_t begin, int64_t end,
                  acc_t a, acc_t b, acc_t& px, acc_t& py) {
  for (int64_t i = begin; i < end; ++i) {
    const acc_t xv = static_cast<acc_t>(x[i]), yv = static_cast<acc_t>(y[i]);
    px += nonfinite_probe(xv);
    py += nonfinite_probe(yv);
    out[i] = static_cast<out_t>(axpby_math(a, xv, b, yv));
  }
}

template <typename x_t, typename y_t, typename out_t>
AxpbyStats axpby_chunk(const x_t* x, const y_t* y, out_t* out, int64_t n, float a, float b) {
  const fVec av(a), bv(b);
  fVec px(0.f), py(0.f);
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) {
    fVec x0, x1, y0, y1;
    VecIO<x_t>::load(x + i, x0, x1);
    VecIO<y_t>::load(y + i, y0, y1);
    px = px + nonfinite_probe(x0) + nonfinite_probe(x1);
    py = py + nonfinite_probe(y0) + nonfinite_probe(y1);
    VecIO<out_t>::store(out + i, axpby_math(av, x0, bv, y0), axpby_math(av, x1, bv, y1));
  }
  float sx = horizontal_sum(px), sy = horizontal_sum(py);
  axpby_scalar<float>(x, y, out, i, n, a, b, sx, sy);
  return {!(sx == sx), !(sy == sy)};
}

CORE_OPS_CPU_END
