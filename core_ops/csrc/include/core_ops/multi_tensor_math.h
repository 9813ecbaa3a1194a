// Per-element math of the multi-tensor ops, written once.
//
// Every function is a template over the value type so that one definition serves
// three callers: the CUDA functors (T = float or double), the CPU tail loops (same),
// and the CPU vector loops (T = vec::Vectorized<float>), whose operators * and +
// broadcast like scalars. See Note [Multi-tensor conventions] in core_ops/_schemas.py.
#pragma once

#include <core_ops/macros.h>

namespace core_ops {

template <typename T>
CORE_OPS_HD T scale_math(T x, T scale) {
  return x * scale;
}

template <typename T>
CORE_OPS_HD T axpby_math(T a, T x, T b, T y) {
  return a * x + b * y;
}

// Note [Non-finite probe]: x * 0 is 0 for every finite x and nan for inf or nan, so
// summing probes over a chunk gives nan exactly when the chunk held a non-finite
// value. This needs no branch and no compare, so it vectorizes and costs one
// multiply-add per element. (It relies on IEEE semantics: no -ffast-math.)
template <typename T>
CORE_OPS_HD T nonfinite_probe(T x) {
  return x * T(0);
}

template <typename T>
CORE_OPS_HD T square_math(T x) {
  return x * x;
}

}  // namespace core_ops
