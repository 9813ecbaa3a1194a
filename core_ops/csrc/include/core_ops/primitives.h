// The few functions the per-element math needs beyond + - * /, overloaded for every
// value type the math runs on: float and double (host and device) and, in CPU
// translation units, at::vec::Vectorized<float>. The math headers call these
// unqualified, so one template serves the CUDA functor, the CPU tail loop and the
// CPU vector loop (Note [Math written once]).
#pragma once

#include <cmath>
#include <tuple>

#include <core_ops/macros.h>

#if !defined(__CUDACC__) && !defined(__HIPCC__)
#include <ATen/cpu/vec/vec.h>
// convert_to_float / convert_from_float: torch 2.14's vec.h brings them; 2.6's does not
// (they live only in functional_bfloat16.h there), and functional.h includes them in both.
#include <ATen/cpu/vec/functional.h>
#endif

namespace core_ops {

CORE_OPS_HD float vsqrt(float x) { return sqrtf(x); }
CORE_OPS_HD double vsqrt(double x) { return sqrt(x); }
CORE_OPS_HD float vmax(float a, float b) { return fmaxf(a, b); }
CORE_OPS_HD double vmax(double a, double b) { return fmax(a, b); }

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
  at::vec::Vectorized<float> operator()(const at::vec::Vectorized<float>& x) const {
    return std::get<0>(at::vec::convert_to_float<T>(at::vec::convert_from_float<T>(x, x)));
  }
#endif
};

#if !defined(__CUDACC__) && !defined(__HIPCC__)
inline at::vec::Vectorized<float> vsqrt(const at::vec::Vectorized<float>& x) { return x.sqrt(); }
inline at::vec::Vectorized<float> vmax(const at::vec::Vectorized<float>& a,
                                       const at::vec::Vectorized<float>& b) {
  return at::vec::maximum(a, b);
}
#endif

}  // namespace core_ops
