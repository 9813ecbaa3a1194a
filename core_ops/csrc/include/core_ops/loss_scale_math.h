// The dynamic loss-scale update, written once for the CPU kernel and the one-thread
// CUDA kernel. Semantics: Note [Loss-scale update] in core_ops/reference/loss_scale.py.
#pragma once

#include <cstdint>

#include <core_ops/macros.h>

namespace core_ops {

template <typename T>
CORE_OPS_HD bool finite_value(T x) {
  return (x - x) == (x - x);  // nan - nan and inf - inf are nan; nan != nan
}

CORE_OPS_HD void update_scale_math(
    float* scale, int32_t* growth_tracker, int32_t* hysteresis_tracker, bool found_inf,
    float growth_factor, float backoff_factor, int64_t growth_interval,
    int64_t hysteresis, float min_scale, float max_scale) {
  if (found_inf) {
    *growth_tracker = 0;
    // In 64 bits: a tracker loaded from a checkpoint may hold any int32.
    const int64_t left = static_cast<int64_t>(*hysteresis_tracker) - 1;
    *hysteresis_tracker = left > 0 ? static_cast<int32_t>(left) : 0;
    if (left <= 0) {
      float backed_off = *scale * backoff_factor;
      if (backed_off < 1.17549435e-38f) backed_off = 0.f;  // FLT_MIN: flushed, as Apex's kernel
      *scale = backed_off < min_scale ? min_scale : backed_off;
    }
    return;
  }
  *hysteresis_tracker = static_cast<int32_t>(hysteresis);
  int64_t count = static_cast<int64_t>(*growth_tracker) + 1;  // INT32_MAX + 1 does not overflow
  if (count >= growth_interval) {
    float grown = *scale * growth_factor;
    if (finite_value(grown)) {
      *scale = grown > max_scale ? max_scale : grown;
    }
    count = 0;
  }
  *growth_tracker = static_cast<int32_t>(count);  // < growth_interval <= INT32_MAX
}

}  // namespace core_ops
