// Host-side pieces every CPU fused optimizer kernel shares: reading the optional
// scalars, skipping on found_inf, advancing the per-tensor step counts.
#pragma once

#include <array>
#include <initializer_list>
#include <optional>
#include <type_traits>
#include <vector>

#include <core_ops/bool_switch.h>
#include <core_ops/dispatch.h>
#include <core_ops/optimizer_ops.h>

#include "level.h"
#include "multi_tensor_apply.h"

CORE_OPS_CPU_BEGIN

inline bool flag_is_set(const OptionalTensor& found_inf) {
  if (!found_inf.has_value()) return false;
  return dtype_of(*found_inf) == ScalarType::Float ? *data<float>(*found_inf) > 0
                                                       : *data<int32_t>(*found_inf) > 0;
}

inline double value_or(const OptionalTensor& t, double fallback) {
  return t.has_value() ? item(*t) : fallback;
}

// steps[i] += 1 for every tensor; returns the new counts.
inline std::vector<double> advance_steps(TensorList steps) {
  std::vector<double> out(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    float* s = data<float>(steps[i]);
    *s += 1.f;
    out[i] = *s;
  }
  return out;
}

// Runs f(param_t{}, has_master, chunk) over every chunk of params, in parallel, with
// param_t the params' element type (double, or float / Half / BFloat16 with float
// state) and has_master a std::bool_constant telling whether master weights are used.
template <typename F>
void for_each_param_chunk(TensorList params, bool master, F&& f) {
  const auto chunks = make_chunks(params);
  for_param_types(dtype_of(params[0]), master, [&](auto param, auto, auto has_master) {
    parallel_chunks(chunks, [&](const Chunk& c) { f(param, has_master, c); });
  });
}

// State and compute type for params of type param_t.
template <typename param_t>
using state_t = acc_of<param_t>;

// How a step reads its grads: divided by grad_scale (by -grad_scale for maximize, which
// also negates, exactly) and, when the scale is not 1, written back unscaled
// (Note [Grads written back unscaled] in optimizer_args.h).
struct GradUnscale {
  double scale;
  bool maximize;
  bool write;

  GradUnscale(const OptionalTensor& grad_scale, bool maximize_)
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

// What every CPU fused optimizer step does around its loop, the twin of the CUDA
// OptimizerLaunch; made once found_inf was found clear (a skipped step changes
// nothing, steps included).
struct CpuStep {
  const double lr;                      // lr_tensor's value when given
  const GradUnscale unscale;
  const std::vector<double> step;       // the counts this step advanced to (steps[i] += 1)
  const std::vector<Tensor> grads;      // in their params' layout (grads_like_params)

  // like: grads_like_params' (float32 grads of half params: the masters).
  CpuStep(TensorList params, TensorList grads_, TensorList steps, double lr_, const OptionalTensor& lr_tensor,
          const OptionalTensor& grad_scale, bool maximize, TensorList like = {})
      : lr(value_or(lr_tensor, lr_)), unscale(grad_scale, maximize), step(advance_steps(steps)),
        grads(grads_like_params(params, grads_, like)) {}

  // The caller's grads get the unscaled values the loop wrote into copies made for
  // their layout (Note [Grads written back unscaled]).
  void finish(TensorList user_grads) const {
    if (unscale.write) copy_back_grads(user_grads, grads);
  }
};

// Each tensor's coefficients in both scalar types: the float ones serve float, half
// and bfloat16 params, the double ones double params. make(float{} or double{}, i).
template <typename F, typename D>
struct CoeffsByType {
  std::vector<F> for_float;
  std::vector<D> for_double;

  template <typename param_t>
  const auto& get(int64_t t) const {
    if constexpr (std::is_same_v<param_t, double>) {
      return for_double[t];
    } else {
      return for_float[t];
    }
  }
};

template <typename Make>
auto coeffs_per_tensor(size_t n, const Make& make) {
  CoeffsByType<decltype(make(float{}, size_t{})), decltype(make(double{}, size_t{}))> out;
  for (size_t i = 0; i < n; ++i) {
    out.for_float.push_back(make(float{}, i));
    out.for_double.push_back(make(double{}, i));
  }
  return out;
}

// Note [One loop moves a CPU optimizer's memory]: the CPU twin of the CUDA
// ElementwiseStep for the optimizers that update their weights in place from their
// grads and kSlots state slots (Adam, SGD, Adagrad, NovoGrad). Per element it reads
// the weights (the fp32 master when there is one, else the param, in the state type),
// the grad through GradReader, and the slots; calls math(x, g, slots) (x and the
// slots updated in place, slots a std::array); writes back the slots and the weights
// (master and param). math is a generic lambda: the vector loop calls it with fVec
// (float / half / bfloat16 params, two vectors a step), the tail loop with the state
// type, so both run the same *_math.h template (Note [Math written once]).
// kUnscale = false reads the grads as they are: for a step that divides by 1 (g / 1
// == g exactly), where a vector division is the loop's costliest instruction. The
// grads are of the params' type, or float32 (grad_t: Note [Master grads]).
template <typename param_t, size_t kSlots, typename grad_t = param_t>
struct StepPtrs {
  param_t* param;
  grad_t* grad;
  state_t<param_t>* master;  // nullptr: no master weights
  std::array<state_t<param_t>*, kSlots> slots;
};

template <bool kMaster, bool kUnscale, typename param_t, size_t kSlots, typename grad_t, typename Math>
void step_chunk(const StepPtrs<param_t, kSlots, grad_t>& t, int64_t begin, int64_t end,
                const GradReader<state_t<param_t>>& grads, const Math& math) {
  using acc_t = state_t<param_t>;
  int64_t i = begin;
  if constexpr (!std::is_same_v<param_t, double>) {
    for (; i + kWidth <= end; i += kWidth) {
      fVec x0, x1, g0, g1;
      std::array<fVec, kSlots> s0, s1;
      if constexpr (kMaster) load2(t.master + i, x0, x1); else load2(t.param + i, x0, x1);
      if constexpr (kUnscale) grads.load(t.grad + i, g0, g1); else load2(t.grad + i, g0, g1);
      for (size_t j = 0; j < kSlots; ++j) load2(t.slots[j] + i, s0[j], s1[j]);
      math(x0, g0, s0);
      math(x1, g1, s1);
      for (size_t j = 0; j < kSlots; ++j) store2(t.slots[j] + i, s0[j], s1[j]);
      if constexpr (kMaster) store2(t.master + i, x0, x1);
      store2(t.param + i, x0, x1);
    }
  }
  for (; i < end; ++i) {
    acc_t x = kMaster ? t.master[i] : static_cast<acc_t>(t.param[i]);
    const acc_t g = kUnscale ? grads.load(t.grad + i) : static_cast<acc_t>(t.grad[i]);
    std::array<acc_t, kSlots> s;
    for (size_t j = 0; j < kSlots; ++j) s[j] = t.slots[j][i];
    math(x, g, s);
    for (size_t j = 0; j < kSlots; ++j) t.slots[j][i] = s[j];
    if constexpr (kMaster) t.master[i] = x;
    t.param[i] = static_cast<param_t>(x);
  }
}

// The element types of one chunk's loop, for a math that depends on them (SGD's
// roundings of a half param without masters).
template <typename param_t_, bool kMaster_>
struct StepTypes {
  using param_t = param_t_;
  static constexpr bool kMaster = kMaster_;
};

// step_chunk over every chunk of params, in parallel, with the grads st read (in the
// params' layout) and each tensor's coefficients: math(x, g, slots, coeffs, StepTypes).
// `slots` in math's order; an absent optional list passed empty is left out.
// kMasterGrads: the grads are float32, the masters' (Note [Master grads]).
template <size_t kSlots, bool kUnscale = true, bool kMasterGrads = false, typename Coeffs, typename Math>
void step_params(TensorList params, const CpuStep& st, TensorList masters, std::initializer_list<TensorList> slots,
                 const Coeffs& coeffs, const Math& math) {
  std::vector<TensorList> present;
  for (const TensorList ts : slots) {
    if (!ts.empty()) present.push_back(ts);
  }
  CORE_OPS_ASSERT(present.size() == kSlots, "expected ", kSlots, " state lists, got ", present.size());
  for_each_param_chunk(params, !masters.empty(), [&](auto tag, auto has_master, const Chunk& ch) {
    using param_t = decltype(tag);
    using acc_t = state_t<param_t>;
    using grad_t = std::conditional_t<kMasterGrads, acc_t, param_t>;
    const int64_t t = ch.tensor;
    StepPtrs<param_t, kSlots, grad_t> ptrs{static_cast<param_t*>(params[t].data_ptr()),
                                           static_cast<grad_t*>(st.grads[t].data_ptr()),
                                           has_master ? static_cast<acc_t*>(masters[t].data_ptr()) : nullptr, {}};
    for (size_t j = 0; j < kSlots; ++j) ptrs.slots[j] = static_cast<acc_t*>(present[j][t].data_ptr());
    const auto& c = coeffs.template get<param_t>(t);
    const StepTypes<param_t, decltype(has_master)::value> types;
    step_chunk<has_master, kUnscale>(ptrs, ch.begin, ch.end, GradReader<acc_t>(st.unscale),
                                     [&](auto& x, auto g, auto& s) { math(x, g, s, c, types); });
  });
}

CORE_OPS_CPU_END
