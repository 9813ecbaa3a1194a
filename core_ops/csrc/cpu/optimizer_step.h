// Host-side pieces every CPU fused optimizer kernel shares: reading the optional
// scalars, skipping on found_inf, advancing the per-tensor step counts.
#pragma once

#include <optional>
#include <type_traits>
#include <vector>

#include <core_ops/bool_switch.h>
#include <core_ops/optimizer_args.h>

#include "multi_tensor_apply.h"

namespace core_ops::cpu {

inline bool flag_is_set(const std::optional<at::Tensor>& found_inf) {
  if (!found_inf.has_value()) return false;
  return found_inf->scalar_type() == at::kFloat ? *found_inf->data_ptr<float>() > 0
                                                : *found_inf->data_ptr<int32_t>() > 0;
}

inline double value_or(const std::optional<at::Tensor>& t, double fallback) {
  return t.has_value() ? t->item<double>() : fallback;
}

// steps[i] += 1 for every tensor; returns the new counts.
inline std::vector<double> advance_steps(at::TensorList steps) {
  std::vector<double> out(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    float* s = steps[i].data_ptr<float>();
    *s += 1.f;
    out[i] = *s;
  }
  return out;
}

// Runs f(param_t{}, has_master, chunk) over every chunk of params, in parallel, with
// param_t the params' element type (double, or float / Half / BFloat16 with float
// state) and has_master a std::bool_constant telling whether master weights are used.
template <typename F>
void for_each_param_chunk(at::TensorList params, bool master, F&& f) {
  const auto chunks = make_chunks(params);
  if (params[0].scalar_type() == at::kDouble) {
    TORCH_INTERNAL_ASSERT(!master);  // check_masters
    parallel_chunks(chunks, [&](const Chunk& c) { f(double{}, std::false_type{}, c); });
    return;
  }
  bool_switch(master, [&](auto has_master) {
    CORE_OPS_DISPATCH_FLOAT_HALF_BF16(params[0].scalar_type(), "params", param_t,
      parallel_chunks(chunks, [&](const Chunk& c) { f(param_t{}, has_master, c); }));
  });
}

// State and compute type for params of type param_t.
template <typename param_t>
using state_t = std::conditional_t<std::is_same_v<param_t, double>, double, float>;

// The float-vector loads used by the optimizer loops, for the float/half/bf16 path.
template <typename T>
inline void load2(const T* p, fVec& a, fVec& b) { VecIO<T>::load(p, a, b); }
template <typename T>
inline void store2(T* p, const fVec& a, const fVec& b) { VecIO<T>::store(p, a, b); }

// How a step reads its grads: divided by grad_scale (by -grad_scale for maximize, which
// also negates, exactly) and, when the scale is not 1, written back unscaled
// (Note [Grads written back unscaled] in optimizer_args.h).
struct GradUnscale {
  double scale;
  bool maximize;
  bool write;

  GradUnscale(const std::optional<at::Tensor>& grad_scale, bool maximize_)
      : scale(value_or(grad_scale, 1.0)), maximize(maximize_), write(writes_grads(grad_scale, scale)) {}

  double div() const { return maximize ? -scale : scale; }
};

// GradUnscale's reads for one chunk, in the math type acc_t: a vector pair or one element.
template <typename acc_t>
struct GradReader {
  acc_t div, sign;
  bool write;
  fVec vdiv, vsign;

  explicit GradReader(const GradUnscale& u)
      : div(static_cast<acc_t>(u.div())), sign(u.maximize ? -1 : 1), write(u.write),
        vdiv(static_cast<float>(u.div())), vsign(u.maximize ? -1.f : 1.f) {}

  template <typename T>
  void load(T* g, fVec& g0, fVec& g1) const {
    load2(g, g0, g1);
    g0 = g0 / vdiv;
    g1 = g1 / vdiv;
    if (write) store2(g, g0 * vsign, g1 * vsign);  // x * -1 is exact
  }

  template <typename T>
  acc_t load(T* g) const {
    const acc_t v = static_cast<acc_t>(*g) / div;
    if (write) *g = static_cast<T>(v * sign);
    return v;
  }
};

}  // namespace core_ops::cpu
