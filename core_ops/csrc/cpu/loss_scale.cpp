// CPU kernel of update_scale_: the math is core_ops/loss_scale_math.h.
#include <torch/csrc/stable/library.h>

#include <core_ops/loss_scale_math.h>

#include "level.h"
#include "multi_tensor_apply.h"

CORE_OPS_CPU_BEGIN
namespace {

void update_scale_(const Tensor& scale, const Tensor& growth_tracker, const Tensor& hysteresis_tracker,
                   const Tensor& found_inf,
                   double growth_factor, double backoff_factor, int64_t growth_interval,
                   int64_t hysteresis, double min_scale, double max_scale) {
  check_update_scale_args(scale, growth_tracker, hysteresis_tracker, found_inf);
  check_loss_scale_settings(growth_factor, backoff_factor, growth_interval, hysteresis, min_scale, max_scale);
  const bool inf = dtype_of(found_inf) == ScalarType::Float ? *data<float>(found_inf) > 0
                                                                : *data<int32_t>(found_inf) > 0;
  update_scale_math(data<float>(scale), data<int32_t>(growth_tracker),
                    data<int32_t>(hysteresis_tracker), inf,
                    static_cast<float>(growth_factor), static_cast<float>(backoff_factor),
                    growth_interval, hysteresis, static_cast<float>(min_scale),
                    static_cast<float>(max_scale));
}

}  // namespace
CORE_OPS_CPU_END

CORE_OPS_CPU_KERNELS(m) {
  m.impl("update_scale_", TORCH_BOX(&update_scale_));
}
