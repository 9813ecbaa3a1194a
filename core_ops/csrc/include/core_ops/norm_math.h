// The per-element math of the layer-norm and RMS-norm ops (Note [Norm ops] in
// _schemas.py), shared by the CPU kernels (on vec::Vectorized vectors and scalars) and the
// CUDA kernels (on floats). A row of `hidden` values has statistics mean and
// rstd = 1 / sqrt(var + eps) (RMS: 1 / sqrt(mean(x^2) + eps)); xhat is the normalized
// value before weight and bias; g = dy * weight is the grad reaching xhat.
#pragma once

#include <core_ops/macros.h>

namespace core_ops {

template <typename T>
CORE_OPS_HD T layer_norm_out(T x, T mean, T rstd, T w, T b) {
  return (x - mean) * rstd * w + b;
}

template <typename T>
CORE_OPS_HD T rms_norm_out(T x, T rstd, T w) {
  return x * rstd * w;
}

// xhat from the forward's output (memory_efficient backward): the affine map inverted.
template <typename T>
CORE_OPS_HD T layer_norm_xhat_from_out(T y, T w, T b) {
  return (y - b) / w;
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), the means over the row; RMS norm's
// is the same with mean(g) = 0 (its output has no mean subtracted).
template <typename T>
CORE_OPS_HD T layer_norm_dx(T g, T xhat, T rstd, T mean_g, T mean_g_xhat) {
  return rstd * (g - mean_g - xhat * mean_g_xhat);
}

}  // namespace core_ops
