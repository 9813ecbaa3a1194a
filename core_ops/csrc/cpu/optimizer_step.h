// Host-side pieces every CPU fused optimizer kernel shares: reading the optional
// scalars, skipping on found_inf, advancing the per-tensor step counts.
#pragma once

#include <optional>
#include <vector>

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

}  // namespace core_ops::cpu
