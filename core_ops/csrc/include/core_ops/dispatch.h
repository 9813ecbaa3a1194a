// Dtype switches shared by the CPU and CUDA launchers. The multi-tensor ops compute in
// float for float / half / bfloat16 lists (any mix across lists) and in double when
// every list is double (Note [Multi-tensor conventions]).
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <string>

namespace core_ops {

// A dtype as Python spells it ("torch.float16"), so C++ and Python errors read alike.
inline std::string dtype_name(c10::ScalarType t) {
  return "torch." + std::string(c10::getDtypeNames(t).first);
}

}  // namespace core_ops

#define CORE_OPS_CASE_TYPE(ENUM, CPP, NAME, ...) \
  case ENUM: {                                   \
    using NAME = CPP;                            \
    __VA_ARGS__;                                 \
    break;                                       \
  }

// Binds NAME to float, c10::Half or c10::BFloat16 by TYPE; ARG names the list for errors.
#define CORE_OPS_DISPATCH_FLOAT_HALF_BF16(TYPE, ARG, NAME, ...)                     \
  switch (TYPE) {                                                                   \
    CORE_OPS_CASE_TYPE(c10::ScalarType::Float, float, NAME, __VA_ARGS__)            \
    CORE_OPS_CASE_TYPE(c10::ScalarType::Half, c10::Half, NAME, __VA_ARGS__)         \
    CORE_OPS_CASE_TYPE(c10::ScalarType::BFloat16, c10::BFloat16, NAME, __VA_ARGS__) \
    default:                                                                        \
      TORCH_CHECK_TYPE(false, ARG, ": expected float32, float16, bfloat16 or float64 tensors, got ", core_ops::dtype_name(TYPE)); \
  }
