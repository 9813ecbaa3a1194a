// Host-side helpers shared by the CPU and CUDA launchers: the per-tensor argument
// checks, worded as core_ops/_validate.py's check_lists (which serves the reference
// and fake kernels), and Note [Non-contiguous tensors].
#pragma once

#include <initializer_list>
#include <utility>
#include <vector>

#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <core_ops/dispatch.h>

namespace core_ops {

inline void check_same_length(at::TensorList a, const char* a_name, at::TensorList b, const char* b_name) {
  TORCH_CHECK_VALUE(a.size() == b.size(), b_name, " has ", b.size(), " tensors but ", a_name,
                    " has ", a.size());
}

inline void check_list(at::TensorList ts, const char* name, c10::Device device) {
  if (ts.empty()) return;
  const auto dtype = ts[0].scalar_type();
  for (size_t i = 0; i < ts.size(); ++i) {
    TORCH_CHECK_VALUE(ts[i].device() == device, name, "[", i, "] is on ", ts[i].device(),
                      " but the op runs on ", device);
    TORCH_CHECK_TYPE(ts[i].scalar_type() == dtype, name, "[", i, "] has dtype ",
                     dtype_name(ts[i].scalar_type()), " but ", name, "[0] has ", dtype_name(dtype),
                     "; group tensors by dtype first");
    TORCH_CHECK_TYPE(ts[i].layout() == c10::kStrided, name, "[", i, "] is a ", ts[i].layout(),
                     " tensor; only dense tensors are supported (sparse gradients cannot be fused)");
  }
}

inline void check_same_numel(at::TensorList a, const char* a_name, at::TensorList b, const char* b_name) {
  for (size_t i = 0; i < a.size(); ++i) {
    TORCH_CHECK_VALUE(a[i].sizes() == b[i].sizes(), b_name, "[", i, "] has shape ", b[i].sizes(),
                      " but ", a_name, "[", i, "] has shape ", a[i].sizes());
  }
}

// b matches a index by index: as many tensors, each list on a's device in one dtype,
// the same shapes. False when both are empty (nothing to do).
inline bool check_matching_lists(at::TensorList a, const char* a_name, at::TensorList b, const char* b_name) {
  check_same_length(a, a_name, b, b_name);
  if (a.empty()) return false;
  check_list(a, a_name, a[0].device());
  check_list(b, b_name, a[0].device());
  check_same_numel(a, a_name, b, b_name);
  return true;
}

inline void check_flag(const at::Tensor& found_inf, c10::Device device) {
  TORCH_CHECK_VALUE(found_inf.numel() == 1 && found_inf.device() == device,
                    "found_inf must be a one-element tensor on ", device);
  TORCH_CHECK_TYPE(found_inf.scalar_type() == at::kFloat || found_inf.scalar_type() == at::kInt,
                   "found_inf must be float32 or int32, got ", found_inf.scalar_type());
}

inline bool is_double_list(at::TensorList ts) {
  return !ts.empty() && ts[0].scalar_type() == at::kDouble;
}

// Note [Non-contiguous tensors]: kernels walk raw memory, so every tensor they touch
// must be contiguous. Inputs are made contiguous (a copy only when needed); an output
// that is not contiguous is computed into a contiguous temporary that finish() copies
// back, so the caller's tensor is written in place with the right strides.
struct ContiguousList {
  std::vector<at::Tensor> tensors;
  std::vector<std::pair<at::Tensor, at::Tensor>> write_back;  // (user's, temporary)

  ContiguousList(at::TensorList ts, bool output) {
    tensors.reserve(ts.size());
    for (const auto& t : ts) {
      if (t.is_contiguous()) {
        tensors.push_back(t);
      } else {
        tensors.push_back(t.contiguous());
        if (output) write_back.emplace_back(t, tensors.back());
      }
    }
  }
  void finish() {
    for (auto& [user, tmp] : write_back) user.copy_(tmp);
  }
};

// ---- each op's argument checks, shared by its CPU and CUDA kernels ----------------

// True when every non-empty list is float64 (the op computes in double), false when
// none is; mixing is an error.
inline bool all_or_no_double(std::initializer_list<at::TensorList> lists, const char* names) {
  int doubles = 0, others = 0;
  for (const auto& ts : lists) {
    if (ts.empty()) continue;
    (ts[0].scalar_type() == at::kDouble ? doubles : others) += 1;
  }
  TORCH_CHECK_TYPE(doubles == 0 || others == 0, names,
                   ": float64 lists cannot be mixed with other dtypes");
  return doubles > 0;
}

// An output may be its input (in place) but not overlap it partly (a shifted view):
// the kernels read and write in chunks, in parallel, so the result would depend on
// the order (Note [Partial overlap] in _validate.py words the same check).
inline void check_no_partial_overlap(at::TensorList in, const char* in_name, at::TensorList out,
                                     const char* out_name) {
  for (size_t i = 0; i < out.size(); ++i) {
    TORCH_CHECK_VALUE(at::get_overlap_status(in[i], out[i]) != at::MemOverlapStatus::Partial,
                      out_name, "[", i, "] partly overlaps ", in_name, "[", i,
                      "] in memory; write in place (the same tensor) or into separate memory");
  }
}

// Returns false when there is nothing to do (empty lists).
inline bool check_scale_args(at::TensorList src, at::TensorList dst, const at::Tensor& found_inf) {
  if (!check_matching_lists(src, "src", dst, "dst")) return false;
  check_no_partial_overlap(src, "src", dst, "dst");
  check_flag(found_inf, src[0].device());
  return true;
}

inline bool check_check_finite_args(at::TensorList tensors, const at::Tensor& found_inf) {
  if (tensors.empty()) return false;
  const auto device = tensors[0].device();
  check_list(tensors, "tensors", device);
  check_flag(found_inf, device);
  return true;
}

inline bool check_axpby_args(at::TensorList x, at::TensorList y, at::TensorList out,
                             const at::Tensor& found_inf, int64_t arg_to_check) {
  check_same_length(x, "x", y, "y");
  check_same_length(x, "x", out, "out");
  TORCH_CHECK_VALUE(arg_to_check >= -1 && arg_to_check <= 1,
                    "arg_to_check must be -1 (both), 0 (x) or 1 (y), got ", arg_to_check);
  if (x.empty()) return false;
  const auto device = x[0].device();
  check_list(x, "x", device);
  check_list(y, "y", device);
  check_list(out, "out", device);
  check_same_numel(x, "x", y, "y");
  check_same_numel(x, "x", out, "out");
  check_no_partial_overlap(x, "x", out, "out");
  check_no_partial_overlap(y, "y", out, "out");
  check_flag(found_inf, device);
  return true;
}

inline void check_update_scale_args(const at::Tensor& scale, const at::Tensor& growth_tracker,
                                    const at::Tensor& hysteresis_tracker,
                                    const at::Tensor& found_inf) {
  TORCH_CHECK_TYPE(scale.scalar_type() == at::kFloat && scale.numel() == 1,
                   "scale must be a one-element float32 tensor");
  TORCH_CHECK_TYPE(growth_tracker.scalar_type() == at::kInt && growth_tracker.numel() == 1,
                   "growth_tracker must be a one-element int32 tensor");
  TORCH_CHECK_TYPE(hysteresis_tracker.scalar_type() == at::kInt && hysteresis_tracker.numel() == 1,
                   "hysteresis_tracker must be a one-element int32 tensor");
  // The kernels dereference all four: they must share scale's device.
  TORCH_CHECK_VALUE(growth_tracker.device() == scale.device() &&
                    hysteresis_tracker.device() == scale.device(),
                    "growth_tracker and hysteresis_tracker must be on ", scale.device());
  check_flag(found_inf, scale.device());
}

}  // namespace core_ops
