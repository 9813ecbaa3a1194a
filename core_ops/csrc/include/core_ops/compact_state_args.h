// Argument checks of fused_adam_compact_, shared by its CPU and CUDA kernels; worded
// as core_ops/_validate.py's check_compact_adam (reference and fake kernels).
#pragma once

#include <optional>

#include <core_ops/compact_state.h>
#include <core_ops/optimizer_args.h>
#include <core_ops/tensor.h>

namespace core_ops {

enum class MomentKind { kFloat, kBFloat16, kCodes };
enum class WeightKind { kParam, kMaster, kRemainder };

// `ts`: one tensor per param, its shape and strides, on its device, one dtype.
inline void check_like_params(TensorList params, TensorList ts, const char* name) {
  check_same_length(params, "params", ts, name);
  check_list(ts, name, params[0].device());
  check_same_numel(params, "params", ts, name);
  for (size_t i = 0; i < ts.size(); ++i) {
    CORE_OPS_CHECK_VALUE(same_layout(ts[i], params[i]), name, "[", i,
                         "] must have the shape and strides of params[", i, "] ", params[i].strides(),
                         ", got ", ts[i].strides());
  }
}

inline MomentKind check_compact_moments(TensorList params, TensorList exp_avgs,
                                        TensorList exp_avg_sqs) {
  check_like_params(params, exp_avgs, "exp_avgs");
  check_like_params(params, exp_avg_sqs, "exp_avg_sqs");
  const auto dtype = dtype_of(exp_avgs[0]);
  CORE_OPS_CHECK_TYPE(dtype == ScalarType::Float || dtype == ScalarType::BFloat16 || dtype == ScalarType::Byte,
                      "exp_avgs: expected float32, bfloat16 or uint8 tensors, got ", dtype_name(dtype));
  CORE_OPS_CHECK_TYPE(dtype_of(exp_avg_sqs[0]) == dtype, "exp_avg_sqs have dtype ",
                      dtype_name(dtype_of(exp_avg_sqs[0])), " but exp_avgs ", dtype_name(dtype));
  return dtype == ScalarType::Float ? MomentKind::kFloat
                             : (dtype == ScalarType::BFloat16 ? MomentKind::kBFloat16 : MomentKind::kCodes);
}

// A map held on the host is read here for free: its codes decode through it, and
// encoding walks its midpoints upwards, so it must be finite and ascending (a GPU's map
// is read only on the device; checking it there would cost a host sync each step).
inline void check_map_values(const Tensor& map, const char* map_name) {
  if (map.device().type() != DeviceType::CPU) return;
  const float* v = data<const float>(map);
  for (int j = 0; j < kMapSize; ++j) {
    CORE_OPS_CHECK_VALUE(v[j] - v[j] == 0.f && (j == 0 || v[j - 1] <= v[j]), map_name,
                         " must hold finite values in ascending order; value ", j, " is ", v[j],
                         j > 0 ? words(" after ", v[j - 1]) : std::string());
  }
}

inline void check_absmaxes(TensorList params, TensorList absmaxes, const char* name,
                           const OptionalTensor& map, const char* map_name, bool quantized) {
  if (!quantized) {
    CORE_OPS_CHECK_VALUE(absmaxes.empty(), name, " must be empty for float32 or bfloat16 moments");
    return;
  }
  check_same_length(params, "params", absmaxes, name);
  check_devices(absmaxes, name, params[0].device());
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t blocks = (params[i].numel() + kQuantBlock - 1) / kQuantBlock;
    CORE_OPS_CHECK_VALUE(dtype_of(absmaxes[i]) == ScalarType::Float && absmaxes[i].device() == params[i].device() &&
                             absmaxes[i].dim() == 1 && absmaxes[i].numel() == blocks && absmaxes[i].is_contiguous(),
                         name, "[", i, "] must be a contiguous float32 tensor of ", blocks, " block maxima on ",
                         params[i].device(), ", got ", dtype_of(absmaxes[i]), " ", absmaxes[i].sizes(), " on ",
                         absmaxes[i].device());
  }
  CORE_OPS_CHECK_VALUE(map.has_value() && dtype_of(*map) == ScalarType::Float && map->numel() == kMapSize &&
                           map->dim() == 1 && map->device() == params[0].device() && map->is_contiguous(),
                       map_name, " must be a contiguous float32 tensor of 256 values on ", params[0].device(),
                       " for uint8 moments");
  check_map_values(*map, map_name);
}

inline WeightKind check_compact_masters(TensorList params, TensorList master_params) {
  if (master_params.empty()) return WeightKind::kParam;
  check_like_params(params, master_params, "master_params");
  const auto dtype = dtype_of(master_params[0]);
  const auto param = dtype_of(params[0]);
  CORE_OPS_CHECK_TYPE(dtype == ScalarType::Float || dtype == ScalarType::Short,
                      "master_params: expected float32 or int16 tensors, got ", dtype_name(dtype));
  CORE_OPS_CHECK_TYPE(dtype != ScalarType::Short || param == ScalarType::BFloat16,
                      "master_params: int16 remainders are for bfloat16 params, got ", dtype_name(param), " params");
  CORE_OPS_CHECK_TYPE(dtype != ScalarType::Float || param != ScalarType::Float,
                      "master_params: float32 params take no master_params");
  return dtype == ScalarType::Short ? WeightKind::kRemainder : WeightKind::kMaster;
}

inline void check_compact_params(TensorList params) {
  const auto dtype = dtype_of(params[0]);
  CORE_OPS_CHECK_TYPE(dtype == ScalarType::Float || dtype == ScalarType::Half || dtype == ScalarType::BFloat16,
                      "params: compact Adam state is for float32, float16 or bfloat16 params, got ",
                      dtype_name(dtype));
  for (size_t i = 0; i < params.size(); ++i) {
    CORE_OPS_CHECK_VALUE(is_dense(params[i]), "params[", i,
                         "] must be dense (contiguous or a permutation of it), got strides ", params[i].strides());
  }
}

struct CompactLayout {
  MomentKind moments;
  WeightKind weights;
  bool quantized() const { return moments == MomentKind::kCodes; }
};

// Every check of fused_adam_compact_; nullopt for an empty group (nothing to do).
inline std::optional<CompactLayout> check_compact_adam(
    TensorList params, TensorList grads, TensorList exp_avgs, TensorList exp_avg_sqs,
    TensorList exp_avg_absmaxes, TensorList exp_avg_sq_absmaxes, TensorList master_params,
    TensorList steps, const OptionalTensor& exp_avg_map,
    const OptionalTensor& exp_avg_sq_map, const OptionalTensor& lr_tensor,
    const OptionalTensor& grad_scale, const OptionalTensor& found_inf) {
  if (!check_optimizer_group(params, grads, steps, lr_tensor, grad_scale, found_inf)) return std::nullopt;
  check_compact_params(params);
  const CompactLayout layout{check_compact_moments(params, exp_avgs, exp_avg_sqs), WeightKind::kParam};
  check_absmaxes(params, exp_avg_absmaxes, "exp_avg_absmaxes", exp_avg_map, "exp_avg_map", layout.quantized());
  check_absmaxes(params, exp_avg_sq_absmaxes, "exp_avg_sq_absmaxes", exp_avg_sq_map, "exp_avg_sq_map",
                 layout.quantized());
  return CompactLayout{layout.moments, check_compact_masters(params, master_params)};
}

}  // namespace core_ops
