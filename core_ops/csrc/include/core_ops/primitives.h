// The few functions the per-element math needs beyond + - * /, overloaded for every
// value type the math runs on: float and double (host and device) here and, for the
// CPU loops, vec::Vectorized<float> beside that type (csrc/cpu/multi_tensor_apply.h).
// The math headers call these unqualified, so one template serves the CUDA functor,
// the CPU tail loop and the CPU vector loop (Note [Math written once]).
//
// Note [Math written once]: each op's per-element update is one CORE_OPS_HD function
// template in a header of this folder (adam_math.h, sgd_math.h, lamb_math.h, ...),
// templated on the value type T: the CPU kernel calls it with Vectorized<float> in
// its vector loop and with float / double in its tail loop, the CUDA functor with
// float / double per element. The kernel files (csrc/cpu/*.cpp, csrc/cuda/*.cu) only
// load, convert and store: they never restate an update. So:
//   - a change to an op's math is one edit, and CPU and CUDA cannot drift apart;
//   - every value type sees the same operations in the same order and, built with
//     -ffp-contract=off (CPU) / -fmad=false (CUDA, native/build.py), each + and * rounds
//     once: the vector loop, the tail loop and the GPU round alike;
//   - what T lacks beyond + - * / comes from this file (vsqrt, vmax, ...), overloaded
//     per T and called unqualified; a new primitive is added here for the scalars and
//     beside the CPU vector type (found by argument-dependent lookup) for the vectors;
//   - scalars (step sizes, bias corrections) are computed once per tensor in double,
//     then rounded to the math's scalar type, as torch.optim does with Python floats.
#pragma once

#include <cmath>

#include <core_ops/macros.h>

namespace core_ops {

CORE_OPS_HD float vsqrt(float x) { return sqrtf(x); }
CORE_OPS_HD double vsqrt(double x) { return sqrt(x); }
// torch.maximum's, as the CPU vectors' maximum: a NaN in either gives a NaN (fmax would
// drop it, so amsgrad's max_exp_avg_sq forgot a NaN the vector lanes kept).
CORE_OPS_HD float vmax(float a, float b) { return (a != a || b != b) ? a + b : fmaxf(a, b); }
CORE_OPS_HD double vmax(double a, double b) { return (a != a || b != b) ? a + b : fmax(a, b); }

// Note [Half params without masters]: a half param stepped without fp32 master
// weights is updated as torch.optim updates half tensors: every op's result rounded
// to the param's dtype before the next op uses it (its state is kept in float32,
// holding those rounded values). RoundTo<T> is that rounding, NoRound its absence
// (float, double and master-weight steps).
struct NoRound {
  template <typename V>
  CORE_OPS_HD V operator()(const V& x) const { return x; }
};

template <typename T>
struct RoundTo {
  CORE_OPS_HD float operator()(float x) const { return static_cast<float>(static_cast<T>(x)); }
#if !defined(__CUDACC__) && !defined(__HIPCC__)
  // A vector of floats (the CPU vector loops): round_to(T, vector) is declared beside
  // the vector type.
  template <typename V>
  V operator()(const V& x) const { return round_to(T{}, x); }
#endif
};

}  // namespace core_ops
