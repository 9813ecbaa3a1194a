// Host-side pieces of the sync batch-norm kernels shared by csrc/cpu/sync_batch_norm.cpp
// and csrc/cuda/sync_batch_norm.cu: the argument checks (worded as
// _validate.check_batch_norm_args) and the two memory layouts the kernels read
// (Note [Sync batch norm layouts] in the CPU file).
#pragma once

#include <initializer_list>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <core_ops/dispatch.h>
#include <core_ops/tensor.h>

namespace core_ops {

struct Layout {
  Tensor data;  // contiguous memory in the chosen layout
  bool rows;    // true: (N * L) rows of C channels; false: N * C planes of L values
  int64_t n, c, l;
};

// t with its channel dimension (1) moved last, as t.movedim(1, -1): (N, *, C). A chain
// of transposes, not permute, which torch 2.10's stable headers lack.
inline Tensor channels_last_view(const Tensor& t) {
  Tensor v = t;
  for (int64_t d = 1; d + 1 < t.dim(); ++d) v = torch::stable::transpose(v, d, d + 1);
  return v;
}

// The inverse: (N, *, C) viewed as (N, C, *), as t.movedim(-1, 1).
inline Tensor channels_first_view(const Tensor& t) {
  Tensor v = t;
  for (int64_t d = t.dim() - 1; d > 1; --d) v = torch::stable::transpose(v, d - 1, d);
  return v;
}

inline Layout layout_of(const Tensor& t, bool rows) {
  int64_t l = 1;
  for (int64_t d = 2; d < t.dim(); ++d) l *= t.size(d);
  return {core_ops::contiguous(rows ? channels_last_view(t) : t), rows, t.size(0), t.size(1), l};
}

inline bool reads_rows(const Tensor& t) {
  return t.dim() == 2 || (!t.is_contiguous() && channels_last_view(t).is_contiguous());
}

// An uninitialized tensor in the layout's memory order, viewed as (N, C, *).
inline Tensor empty_in(const Layout& lay, const Tensor& like) {
  const Tensor t = core_ops::empty(lay.data.sizes(), dtype_of(like), like.device());
  return lay.rows ? channels_first_view(t) : t;
}

inline Tensor with_input_strides(const Tensor& result, const Tensor& input) {
  // empty_like gives a dense input's own strides: compared without allocating, since
  // allocating a tensor only to compare strides made two outputs' worth of memory live
  // at once, which glibc then returned to the system after each call, so that every
  // call paid a page fault per page written (~4x the time of the kernel itself on CPU).
  if (is_dense(input) && input.strides().equals(result.strides())) return result;
  Tensor out = core_ops::empty_like(input);
  if (out.strides().equals(result.strides())) return result;
  core_ops::copy_(out, result);
  return out;
}

// A shape as Python prints a tuple: (), (4,), (2, 3).
inline std::string shape_str(const Tensor& t) {
  std::string r = "(";
  for (int64_t d = 0; d < t.dim(); ++d) r += (d ? ", " : "") + std::to_string(t.size(d));
  return r + (t.dim() == 1 ? ",)" : ")");
}

// The checks of _validate.check_batch_norm_args, in the same words.
inline void check_batch_norm_args(const Tensor& input, const Tensor* grad_out,
                std::initializer_list<std::pair<const char*, const Tensor*>> stats,
                const OptionalTensor& weight, const OptionalTensor& bias) {
  CORE_OPS_CHECK_VALUE(input.dim() >= 2, "input must have at least 2 dimensions (N, C, ...), got shape ",
                       shape_str(input));
  const auto dt = dtype_of(input);
  CORE_OPS_CHECK_TYPE(dt == ScalarType::Float || dt == ScalarType::Half || dt == ScalarType::BFloat16 ||
                          dt == ScalarType::Double,
                      "input: expected float32, float16, bfloat16 or float64, got ", dtype_name(dt));
  const int64_t channels = input.size(1);
  const auto acc = dt == ScalarType::Double ? ScalarType::Double : ScalarType::Float;
  if (grad_out != nullptr) {
    CORE_OPS_CHECK_VALUE(grad_out->sizes().equals(input.sizes()) && dtype_of(*grad_out) == dt &&
                             grad_out->device() == input.device(),
                         "grad_out has shape ", shape_str(*grad_out), " and dtype ",
                         dtype_name(dtype_of(*grad_out)), " on ", grad_out->device(), " but input has ",
                         shape_str(input), " and ", dtype_name(dt), " on ", input.device());
  }
  for (const auto& [name, t] : stats) {
    CORE_OPS_CHECK_VALUE(t->dim() == 1 && t->size(0) == channels && dtype_of(*t) == acc &&
                             t->device() == input.device(),
                         name, " must be a (", channels, ",) ", dtype_name(acc), " tensor on ",
                         input.device(), ", got ", shape_str(*t), " ", dtype_name(dtype_of(*t)),
                         " on ", t->device());
  }
  for (const auto& [name, t] : {std::pair{"weight", &weight}, std::pair{"bias", &bias}}) {
    if (!t->has_value()) continue;
    const Tensor& v = **t;
    const auto vt = dtype_of(v);  // the kernels read float32, float16, bfloat16 or float64 (not float8)
    const bool kernel_float = vt == ScalarType::Float || vt == ScalarType::Half || vt == ScalarType::BFloat16 ||
                              vt == ScalarType::Double;
    CORE_OPS_CHECK_VALUE(v.dim() == 1 && v.size(0) == channels && kernel_float &&
                             v.device() == input.device(),
                         name, " must be a (", channels, ",) float tensor on ", input.device(), ", got ",
                         shape_str(v), " ", dtype_name(dtype_of(v)), " on ", v.device());
  }
}

}  // namespace core_ops
