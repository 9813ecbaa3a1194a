// Argument checks of the norm ops, shared by csrc/cpu/norms.cpp and csrc/cuda/norms.cu and
// worded as _validate.check_norm_args (Note [Norm ops] in _library.py).
#pragma once

#include <initializer_list>
#include <optional>
#include <utility>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <core_ops/dispatch.h>

namespace core_ops {

inline void check_norm_args(const at::Tensor& input, int64_t hidden,
                            std::initializer_list<std::pair<const char*, const std::optional<at::Tensor>*>> params,
                            std::optional<at::ScalarType> out_dtype = std::nullopt, const char* name = "input") {
  TORCH_CHECK_TYPE(at::isFloatingType(input.scalar_type()), name, " must be a floating-point tensor, got ",
                   dtype_name(input.scalar_type()));
  TORCH_CHECK_VALUE(hidden >= 1 && (input.numel() % hidden == 0), name, " of shape ", input.sizes(),
                    " does not hold whole rows of hidden=", hidden, " values");
  for (const auto& [pname, p] : params) {
    if (!p->has_value()) continue;
    const at::Tensor& t = p->value();
    TORCH_CHECK_VALUE(t.numel() == hidden, pname, " has ", t.numel(), " elements; expected hidden=", hidden);
    TORCH_CHECK_VALUE(t.device() == input.device(), pname, " is on ", t.device(), ", ", name, " on ", input.device());
    TORCH_CHECK_TYPE(at::isFloatingType(t.scalar_type()), pname, " must be floating-point, got ",
                     dtype_name(t.scalar_type()));
  }
  if (out_dtype.has_value() && *out_dtype != input.scalar_type()) {
    const bool half = input.scalar_type() == at::kHalf || input.scalar_type() == at::kBFloat16;
    TORCH_CHECK_TYPE(*out_dtype == at::kFloat && half, "out_dtype must be ", name, "'s dtype (",
                     dtype_name(input.scalar_type()), ") or, for half input, torch.float32; got ",
                     dtype_name(*out_dtype));
  }
}

}  // namespace core_ops
