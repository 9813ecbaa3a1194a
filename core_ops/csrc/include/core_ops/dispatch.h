// Dtype switches shared by the CPU and CUDA launchers. The multi-tensor ops compute in
// float for float / half / bfloat16 lists (any mix across lists) and in double when
// every list is double (Note [Multi-tensor conventions]).
#pragma once

#include <type_traits>

#include <core_ops/bool_switch.h>
#include <core_ops/tensor.h>

#define CORE_OPS_CASE_TYPE(ENUM, CPP, NAME, ...) \
  case ENUM: {                                   \
    using NAME = CPP;                            \
    __VA_ARGS__;                                 \
    break;                                       \
  }

// Binds NAME to float, core_ops::Half or core_ops::BFloat16 by TYPE; ARG names the list
// for errors.
#define CORE_OPS_DISPATCH_FLOAT_HALF_BF16(TYPE, ARG, NAME, ...)                                       \
  switch (TYPE) {                                                                                     \
    CORE_OPS_CASE_TYPE(::core_ops::ScalarType::Float, float, NAME, __VA_ARGS__)                       \
    CORE_OPS_CASE_TYPE(::core_ops::ScalarType::Half, ::core_ops::Half, NAME, __VA_ARGS__)             \
    CORE_OPS_CASE_TYPE(::core_ops::ScalarType::BFloat16, ::core_ops::BFloat16, NAME, __VA_ARGS__)     \
    default:                                                                                          \
      CORE_OPS_CHECK_TYPE(false, ARG, ": expected float32, float16, bfloat16 or float64 tensors, got ", \
                          ::core_ops::dtype_name(TYPE));                                              \
  }

// Binds NAME to double, float, core_ops::Half or core_ops::BFloat16 by TYPE (the norm
// and batch-norm kernels; a body that returns early is a lambda called in place).
#define CORE_OPS_DISPATCH_FLOATING(TYPE, ARG, NAME, ...)    \
  if ((TYPE) == ::core_ops::ScalarType::Double) {           \
    using NAME = double;                                    \
    __VA_ARGS__;                                            \
  } else                                                    \
    CORE_OPS_DISPATCH_FLOAT_HALF_BF16(TYPE, ARG, NAME, __VA_ARGS__)

namespace core_ops {

// f(param_t{}, acc_t{}, has_master) for the params' dtype, the way every fused
// optimizer's CPU and CUDA launcher picks its kernel: float64 params compute in double
// and have no masters (check_masters), float32 / float16 / bfloat16 params in float,
// with or without fp32 masters; has_master is a std::bool_constant.
template <typename F>
void for_param_types(ScalarType dtype, bool master, F&& f) {
  if (dtype == ScalarType::Double) {
    CORE_OPS_ASSERT(!master, "float64 params take no master_params");
    f(double{}, double{}, std::false_type{});
    return;
  }
  bool_switch(master, [&](auto has_master) {
    CORE_OPS_DISPATCH_FLOAT_HALF_BF16(dtype, "params", param_t, f(param_t{}, float{}, has_master));
  });
}

}  // namespace core_ops
