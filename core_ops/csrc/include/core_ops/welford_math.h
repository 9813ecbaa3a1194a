// Per-element math of the sync batch-norm ops (Note [Sync batch norm ops] in
// core_ops/_schemas.py), written once for the CPU loops (scalars and vec::Vectorized vectors)
// and the CUDA kernels. T is the accumulation type: float (float32, float16 and
// bfloat16 inputs) or double, or a vec::Vectorized of one.
#pragma once

#include <core_ops/macros.h>

namespace core_ops {

// Welford's update with one more value x, given 1 / (count after it): the mean moves
// by a fraction of the new deviation and m2 (the sum of squared deviations) grows by
// the product of the deviations before and after, never subtracting two large sums.
template <typename T>
CORE_OPS_HD void welford_update(T& mean, T& m2, T x, T inv_count) {
  const T delta = x - mean;
  mean = mean + delta * inv_count;
  m2 = m2 + delta * (x - mean);
}

// Chan et al.'s merge of two partial results (mean, m2, count); exact for any counts,
// an empty side included. The same formula merges the ranks' statistics in
// core_ops/parallel/sync_batchnorm_function.py (merge_stats).
template <typename T>
CORE_OPS_HD void welford_combine(T& mean, T& m2, T& count, T mean_b, T m2_b, T count_b) {
  if (count_b == T(0)) return;
  const T total = count + count_b;
  const T delta = mean_b - mean;
  mean = mean + delta * (count_b / total);
  m2 = m2 + m2_b + delta * delta * (count * count_b / total);
  count = total;
}

// Forward: y = (x - mean) * scale + shift, with scale = invstd * weight, shift = bias.
template <typename T>
CORE_OPS_HD T batch_norm_elemt_math(T x, T mean, T scale, T shift) {
  return (x - mean) * scale + shift;
}

// Backward: dx = (dy - mean_dy - (x - mean) * k) * scale, with k = invstd^2 * mean_dy_xmu
// and scale = invstd * weight; mean_dy and mean_dy_xmu are the global sums over the
// global count.
template <typename T>
CORE_OPS_HD T batch_norm_backward_elemt_math(T dy, T x, T mean, T mean_dy, T k, T scale) {
  return (dy - mean_dy - (x - mean) * k) * scale;
}

}  // namespace core_ops
