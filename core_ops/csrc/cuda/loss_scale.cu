// CUDA kernel of update_scale_: the math is core_ops/loss_scale_math.h, run by one
// thread so the scale and trackers never leave the device and the host never waits.
#include <torch/csrc/stable/library.h>

#include <core_ops/loss_scale_math.h>
#include <core_ops/tensor_lists.h>

#include "multi_tensor_apply.cuh"
#include "stream.cuh"

namespace core_ops::cuda {
namespace {

__global__ void update_scale_kernel(float* scale, int32_t* growth_tracker,
                                    int32_t* hysteresis_tracker, FoundInf found_inf,
                                    float growth_factor, float backoff_factor,
                                    int64_t growth_interval, int64_t hysteresis, float min_scale,
                                    float max_scale) {
  // `> 0` as the CPU kernel and the reference: a nan flag does not count as set.
  const bool inf = found_inf.is_int ? *static_cast<const int32_t*>(found_inf.ptr) > 0
                                    : *static_cast<const float*>(found_inf.ptr) > 0.f;
  update_scale_math(scale, growth_tracker, hysteresis_tracker, inf, growth_factor,
                    backoff_factor, growth_interval, hysteresis, min_scale, max_scale);
}

void update_scale_(const Tensor& scale, const Tensor& growth_tracker,
                   const Tensor& hysteresis_tracker, const Tensor& found_inf,
                   double growth_factor, double backoff_factor, int64_t growth_interval,
                   int64_t hysteresis, double min_scale, double max_scale) {
  check_update_scale_args(scale, growth_tracker, hysteresis_tracker, found_inf);
  check_loss_scale_settings(growth_factor, backoff_factor, growth_interval, hysteresis, min_scale, max_scale);
  const auto device = scale.device();
  check_cuda(device);
  const DeviceGuard guard(device.index());
  update_scale_kernel<<<1, 1, 0, current_stream(device.index())>>>(
      data<float>(scale), data<int32_t>(growth_tracker), data<int32_t>(hysteresis_tracker),
      found_inf_arg(found_inf), static_cast<float>(growth_factor), static_cast<float>(backoff_factor),
      growth_interval, hysteresis, static_cast<float>(min_scale), static_cast<float>(max_scale));
  check_launch("update_scale_kernel");
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(core_ops, CUDA, m) {
  m.impl("update_scale_", TORCH_BOX(&update_scale_));
}

}  // namespace core_ops::cuda
