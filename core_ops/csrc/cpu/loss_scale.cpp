// CPU kernel of update_scale_: the math is core_ops/loss_scale_math.h.
#include <torch/library.h>

#include <core_ops/loss_scale_math.h>

#include "multi_tensor_apply.h"

namespace core_ops::cpu {
namespace {

void update_scale_(const at::Tensor& scale, const at::Tensor& growth_tracker,
                   const at::Tensor& hysteresis_tracker, const at::Tensor& found_inf,
                   double growth_factor, double backoff_factor, int64_t growth_interval,
                   int64_t hysteresis, double min_scale, double max_scale) {
  check_update_scale_args(scale, growth_tracker, hysteresis_tracker, found_inf);
  const bool inf = found_inf.scalar_type() == at::kFloat ? *found_inf.data_ptr<float>() > 0
                                                         : *found_inf.data_ptr<int32_t>() > 0;
  update_scale_math(scale.data_ptr<float>(), growth_tracker.data_ptr<int32_t>(),
                    hysteresis_tracker.data_ptr<int32_t>(), inf,
                    static_cast<float>(growth_factor), static_cast<float>(backoff_factor),
                    growth_interval, hysteresis, static_cast<float>(min_scale),
                    static_cast<float>(max_scale));
}

}  // namespace

TORCH_LIBRARY_IMPL(core_ops, CPU, m) {
  m.impl("update_scale_", &update_scale_);
}

}  // namespace core_ops::cpu
