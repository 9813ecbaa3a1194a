// Host-side helpers shared by the CPU and CUDA launchers: the per-tensor argument
// checks, worded as core_ops/_validate.py's check_lists (which serves the reference
// and fake kernels), and Note [Non-contiguous tensors].
#pragma once

#include <initializer_list>
#include <optional>
#include <utility>
#include <vector>

#include <core_ops/aliasing.h>
#include <core_ops/dispatch.h>
#include <core_ops/tensor.h>

namespace core_ops {

inline void check_same_length(TensorList a, const char* a_name, TensorList b, const char* b_name) {
  CORE_OPS_CHECK_VALUE(a.size() == b.size(), b_name, " has ", b.size(), " tensors but ", a_name,
                       " has ", a.size());
}

inline void check_devices(TensorList ts, const char* name, const Device& device) {
  for (size_t i = 0; i < ts.size(); ++i) {
    CORE_OPS_CHECK_VALUE(ts[i].device() == device, name, "[", i, "] is on ", ts[i].device(),
                         " but the op runs on ", device);
  }
}

// One dtype a list, every tensor strided. Devices are CallDevice's, which every op
// runs first over its whole call (each device() is two calls into torch).
inline void check_list(TensorList ts, const char* name, const Device& /*device: CallDevice*/) {
  if (ts.empty()) return;
  const auto dtype = dtype_of(ts[0]);
  for (size_t i = 0; i < ts.size(); ++i) {
    CORE_OPS_CHECK_TYPE(dtype_of(ts[i]) == dtype, name, "[", i, "] has dtype ",
                        dtype_name(dtype_of(ts[i])), " but ", name, "[0] has ", dtype_name(dtype),
                        "; group tensors by dtype first");
    const char* layout = non_strided_layout(ts[i]);
    CORE_OPS_CHECK_TYPE(layout == nullptr, name, "[", i, "] is a ", layout,
                        " tensor; only dense tensors are supported (sparse gradients cannot be fused)");
  }
}

inline void check_same_numel(TensorList a, const char* a_name, TensorList b, const char* b_name) {
  for (size_t i = 0; i < a.size(); ++i) {
    CORE_OPS_CHECK_VALUE(a[i].sizes().equals(b[i].sizes()), b_name, "[", i, "] has shape ", b[i].sizes(),
                         " but ", a_name, "[", i, "] has shape ", a[i].sizes());
  }
}

// b matches a index by index: as many tensors, each list on a's device in one dtype,
// the same shapes. False when both are empty (nothing to do).
inline bool check_matching_lists(TensorList a, const char* a_name, TensorList b, const char* b_name) {
  check_same_length(a, a_name, b, b_name);
  if (a.empty()) return false;
  check_list(a, a_name, a[0].device());
  check_list(b, b_name, a[0].device());
  check_same_numel(a, a_name, b, b_name);
  return true;
}

// Note [One device] (core_ops/_boundary.py): every tensor of a call is on the device of
// its first tensor, in the schema's order, lone tensors included, which dispatch alone
// would not catch (a CUDA kernel reading a host flag). Checked first, before the op
// returns early on empty lists, as the reference and fake kernels check it: a call
// with two faults is refused for the same one on every route.
class CallDevice {
 public:
  CallDevice& list(TensorList ts, const char* name) {
    for (size_t i = 0; i < ts.size(); ++i) see(ts[i], name, static_cast<int64_t>(i));
    return *this;
  }
  CallDevice& one(const Tensor& t, const char* name) {
    see(t, name, -1);
    return *this;
  }
  CallDevice& one(const OptionalTensor& t, const char* name) {
    if (t.has_value()) see(*t, name, -1);
    return *this;
  }

 private:
  void see(const Tensor& t, const char* name, int64_t index) {
    const Device d = t.device();
    if (!device_.has_value()) {
      device_ = d;
      return;
    }
    if (index < 0) {
      CORE_OPS_CHECK_VALUE(d == *device_, name, " is on ", d, " but the op runs on ", *device_);
    } else {
      CORE_OPS_CHECK_VALUE(d == *device_, name, "[", index, "] is on ", d, " but the op runs on ", *device_);
    }
  }
  std::optional<Device> device_;
};

// A found-inf / noop flag: one float32 or int32 element (its device: CallDevice).
inline void check_flag(const Tensor& found_inf) {
  CORE_OPS_CHECK_VALUE(found_inf.numel() == 1, "found_inf must be a one-element tensor, got shape ",
                       found_inf.sizes());
  CORE_OPS_CHECK_TYPE(dtype_of(found_inf) == ScalarType::Float || dtype_of(found_inf) == ScalarType::Int,
                      "found_inf must be float32 or int32, got ", dtype_of(found_inf));
}

inline bool is_double_list(TensorList ts) {
  return !ts.empty() && dtype_of(ts[0]) == ScalarType::Double;
}

// Note [Non-contiguous tensors]: kernels walk raw memory, so every tensor they touch
// must be contiguous. Inputs are made contiguous (a copy only when needed); an output
// that is not contiguous is computed into a contiguous temporary that finish() copies
// back, so the caller's tensor is written in place with the right strides.
// The data pointers are read once here: the CPU loops ask for one per chunk, and each
// read of a stable Tensor's pointer is a call into torch.
struct ContiguousList {
  std::vector<Tensor> tensors;
  std::vector<void*> pointers;                         // tensors[i]'s data
  std::vector<std::pair<Tensor, Tensor>> write_back;  // (user's, temporary)

  ContiguousList(TensorList ts, bool output) {
    tensors.reserve(ts.size());
    pointers.reserve(ts.size());
    for (const auto& t : ts) {
      if (t.is_contiguous()) {
        tensors.push_back(t);
      } else {
        tensors.push_back(torch::stable::contiguous(t));
        if (output) write_back.emplace_back(t, tensors.back());
      }
      pointers.push_back(tensors.back().data_ptr());
    }
  }
  template <typename T>
  T* data(int64_t i) const { return static_cast<T*>(pointers[i]); }
  void finish() {
    for (auto& [user, tmp] : write_back) core_ops::copy_(user, tmp);
  }
};

// ---- each op's argument checks, shared by its CPU and CUDA kernels ----------------

// True when every non-empty list is float64 (the op computes in double), false when
// none is; mixing is an error.
inline bool all_or_no_double(std::initializer_list<TensorList> lists, const char* names) {
  int doubles = 0, others = 0;
  for (const auto& ts : lists) {
    if (ts.empty()) continue;
    (dtype_of(ts[0]) == ScalarType::Double ? doubles : others) += 1;
  }
  CORE_OPS_CHECK_TYPE(doubles == 0 || others == 0, names,
                      ": float64 lists cannot be mixed with other dtypes");
  return doubles > 0;
}

// A list the kernels read as float32 / float16 / bfloat16 / float64 (the dispatch's
// words), checked with the lists, before their float64 mix, as check_lists checks it.
inline void check_floating_list(TensorList ts, const char* name) {
  if (ts.empty()) return;
  const auto dt = dtype_of(ts[0]);
  CORE_OPS_CHECK_TYPE(dt == ScalarType::Float || dt == ScalarType::Half || dt == ScalarType::BFloat16 ||
                          dt == ScalarType::Double,
                      name, ": expected float32, float16, bfloat16 or float64 tensors, got ", dtype_name(dt));
}

// A scalar the kernels read as a number (scale, inv_scale, lr, grad_scale): floating or
// int32 / int64.
inline void check_number(const Tensor& t, const char* name) {
  const auto dt = dtype_of(t);
  CORE_OPS_CHECK_TYPE(is_floating(dt) || dt == ScalarType::Int || dt == ScalarType::Long, name,
                      " must be a floating or integer tensor, got ", dtype_name(dt));
}

// A one-element factor of the list ops (scale, inv_scale), checked where the CPU and
// CUDA kernels read it alike.
inline void check_factor(const Tensor& t, const char* name) {
  CORE_OPS_CHECK_VALUE(t.numel() == 1, name, " must be a one-element tensor, got shape ", t.sizes());
  check_number(t, name);
}

// Returns false when there is nothing to do (empty lists).
inline bool check_scale_args(TensorList src, TensorList dst, const Tensor& scale, const Tensor& found_inf) {
  CallDevice().list(src, "src").list(dst, "dst").one(scale, "scale").one(found_inf, "found_inf");
  Operands(src.size() + dst.size() + 2)
      .reads(src, "src", "dst").reads(scale, "scale").writes(dst, "dst").writes(found_inf, "found_inf").check();
  if (!check_matching_lists(src, "src", dst, "dst")) return false;
  check_floating_list(src, "src");
  check_floating_list(dst, "dst");
  check_flag(found_inf);
  check_factor(scale, "scale");
  return true;
}

inline bool check_check_finite_args(TensorList tensors, const Tensor& found_inf) {
  CallDevice().list(tensors, "tensors").one(found_inf, "found_inf");
  Operands(tensors.size() + 1).reads(tensors, "tensors").writes(found_inf, "found_inf").check();
  if (tensors.empty()) return false;
  check_list(tensors, "tensors", tensors[0].device());
  check_floating_list(tensors, "tensors");
  check_flag(found_inf);
  return true;
}

inline bool check_axpby_args(TensorList x, TensorList y, TensorList out,
                             const Tensor& found_inf, int64_t arg_to_check) {
  CallDevice().list(x, "x").list(y, "y").list(out, "out").one(found_inf, "found_inf");
  Operands(3 * x.size() + 1)
      .reads(x, "x", "out").reads(y, "y", "out").writes(out, "out").writes(found_inf, "found_inf").check();
  check_same_length(x, "x", y, "y");
  check_same_length(x, "x", out, "out");
  CORE_OPS_CHECK_VALUE(arg_to_check >= -1 && arg_to_check <= 1,
                       "arg_to_check must be -1 (both), 0 (x) or 1 (y), got ", arg_to_check);
  if (x.empty()) return false;
  const auto device = x[0].device();
  check_list(x, "x", device);
  check_list(y, "y", device);
  check_list(out, "out", device);
  check_same_numel(x, "x", y, "y");
  check_same_numel(x, "x", out, "out");
  check_floating_list(x, "x");
  check_floating_list(y, "y");
  check_floating_list(out, "out");
  check_flag(found_inf);
  return true;
}

// multi_tensor_unscale_l2norm_'s lists and flag; false for an empty call.
inline bool check_unscale_args(TensorList tensors, const Tensor& inv_scale, const Tensor& found_inf) {
  CallDevice().list(tensors, "tensors").one(inv_scale, "inv_scale").one(found_inf, "found_inf");
  Operands(tensors.size() + 2)
      .writes(tensors, "tensors").reads(inv_scale, "inv_scale").writes(found_inf, "found_inf").check();
  if (tensors.empty()) return false;
  check_list(tensors, "tensors", tensors[0].device());
  check_floating_list(tensors, "tensors");
  check_flag(found_inf);
  check_factor(inv_scale, "inv_scale");
  return true;
}

// _validate.loss_scale_args, in the same words.
inline void check_loss_scale_settings(double growth_factor, double backoff_factor, int64_t growth_interval,
                                      int64_t hysteresis, double min_scale, double max_scale) {
  constexpr int64_t kInt32Max = 2147483647;
  CORE_OPS_CHECK_VALUE(growth_factor >= 1.0, "growth_factor must be >= 1, got ", growth_factor);
  CORE_OPS_CHECK_VALUE(backoff_factor > 0.0 && backoff_factor < 1.0, "backoff_factor must be in (0, 1), got ",
                       backoff_factor);
  CORE_OPS_CHECK_VALUE(growth_interval >= 1 && growth_interval <= kInt32Max && hysteresis >= 1 &&
                           hysteresis <= kInt32Max,
                       "growth_interval and hysteresis must be in [1, 2**31 - 1] (int32 trackers), got ",
                       growth_interval, " and ", hysteresis);
  CORE_OPS_CHECK_VALUE(0.0 <= min_scale && min_scale <= max_scale, "need 0 <= min_scale <= max_scale, got ",
                       min_scale, " and ", max_scale);
}

inline void check_update_scale_args(const Tensor& scale, const Tensor& growth_tracker,
                                    const Tensor& hysteresis_tracker,
                                    const Tensor& found_inf) {
  // The kernels dereference all four: they must share scale's device.
  CallDevice().one(scale, "scale").one(growth_tracker, "growth_tracker")
      .one(hysteresis_tracker, "hysteresis_tracker").one(found_inf, "found_inf");
  Operands(4)
      .writes(scale, "scale").writes(growth_tracker, "growth_tracker")
      .writes(hysteresis_tracker, "hysteresis_tracker").reads(found_inf, "found_inf").check();
  CORE_OPS_CHECK_TYPE(dtype_of(scale) == ScalarType::Float && scale.numel() == 1,
                      "scale must be a one-element float32 tensor");
  CORE_OPS_CHECK_TYPE(dtype_of(growth_tracker) == ScalarType::Int && growth_tracker.numel() == 1,
                      "growth_tracker must be a one-element int32 tensor");
  CORE_OPS_CHECK_TYPE(dtype_of(hysteresis_tracker) == ScalarType::Int && hysteresis_tracker.numel() == 1,
                      "hysteresis_tracker must be a one-element int32 tensor");
  check_flag(found_inf);
}

}  // namespace core_ops
