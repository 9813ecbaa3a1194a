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

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/Exception.h>

#include <core_ops/dispatch.h>

namespace core_ops {

struct Layout {
  at::Tensor data;  // contiguous memory in the chosen layout
  bool rows;        // true: (N * L) rows of C channels; false: N * C planes of L values
  int64_t n, c, l;
};

inline Layout layout_of(const at::Tensor& t, bool rows) {
  int64_t l = 1;
  for (int64_t d = 2; d < t.dim(); ++d) l *= t.size(d);
  return {rows ? t.movedim(1, -1).contiguous() : t.contiguous(), rows, t.size(0), t.size(1), l};
}

inline bool reads_rows(const at::Tensor& t) {
  return t.dim() == 2 || (!t.is_contiguous() && t.movedim(1, -1).is_contiguous());
}

// An uninitialized tensor in the layout's memory order, viewed as (N, C, *).
inline at::Tensor empty_in(const Layout& lay, const at::Tensor& like) {
  return at::empty(lay.data.sizes(), like.options()).movedim(-1, lay.rows ? 1 : -1);
}

inline at::Tensor with_input_strides(const at::Tensor& result, const at::Tensor& input) {
  // The strides empty_like(input) gives, from a meta tensor: allocating a real one
  // only to compare strides made two outputs' worth of memory live at once, which
  // glibc then returned to the system after each call, so that every call paid a
  // page fault per page written (~4x the time of the kernel itself on CPU).
  if (at::empty_like(input, input.options().device(at::kMeta)).strides() == result.strides()) return result;
  at::Tensor out = at::empty_like(input);
  out.copy_(result);
  return out;
}

inline std::string shape_str(const at::Tensor& t) {
  std::ostringstream s;
  s << "(";
  for (int64_t d = 0; d < t.dim(); ++d) s << t.size(d) << (t.dim() == 1 || d + 1 < t.dim() ? ", " : "");
  std::string r = s.str();
  if (t.dim() > 1) r = r.substr(0, r.size() - 2);
  else if (t.dim() == 1) r = r.substr(0, r.size() - 1);
  return r + ")";
}

// The checks of _validate.check_batch_norm_args, in the same words.
inline void check_batch_norm_args(const at::Tensor& input, const at::Tensor* grad_out,
                std::initializer_list<std::pair<const char*, const at::Tensor*>> stats,
                const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK_VALUE(input.dim() >= 2, "input must have at least 2 dimensions (N, C, ...), got shape ",
                    shape_str(input));
  const auto dt = input.scalar_type();
  TORCH_CHECK_TYPE(dt == at::kFloat || dt == at::kHalf || dt == at::kBFloat16 || dt == at::kDouble,
                   "input: expected float32, float16, bfloat16 or float64, got ", dtype_name(dt));
  const int64_t channels = input.size(1);
  const auto acc = dt == at::kDouble ? at::kDouble : at::kFloat;
  if (grad_out != nullptr) {
    TORCH_CHECK_VALUE(grad_out->sizes() == input.sizes() && grad_out->scalar_type() == dt &&
                          grad_out->device() == input.device(),
                      "grad_out has shape ", shape_str(*grad_out), " and dtype ",
                      dtype_name(grad_out->scalar_type()), " on ", grad_out->device(), " but input has ",
                      shape_str(input), " and ", dtype_name(dt), " on ", input.device());
  }
  for (const auto& [name, t] : stats) {
    TORCH_CHECK_VALUE(t->dim() == 1 && t->size(0) == channels && t->scalar_type() == acc &&
                          t->device() == input.device(),
                      name, " must be a (", channels, ",) ", dtype_name(acc), " tensor on ",
                      input.device(), ", got ", shape_str(*t), " ", dtype_name(t->scalar_type()),
                      " on ", t->device());
  }
  for (const auto& [name, t] : {std::pair{"weight", &weight}, std::pair{"bias", &bias}}) {
    if (!t->has_value()) continue;
    const at::Tensor& v = **t;
    TORCH_CHECK_VALUE(v.dim() == 1 && v.size(0) == channels && v.is_floating_point() &&
                          v.device() == input.device(),
                      name, " must be a (", channels, ",) float tensor on ", input.device(), ", got ",
                      shape_str(v), " ", dtype_name(v.scalar_type()), " on ", v.device());
  }
}

}  // namespace core_ops
