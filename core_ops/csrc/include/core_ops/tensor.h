// The one place the kernels meet torch: its stable ABI (torch/csrc/stable) and
// header-only parts (torch/headeronly), nothing else of ATen or c10.
//
// Note [Stable ABI]: built with TORCH_TARGET_VERSION = 2.10 (set by core_ops/native/toolchain.py
// and tools/wheel.sh), a library calls torch only through versioned C shims, so one
// binary loads on torch 2.10 and every newer release: the wheel's prebuilt libraries
// and the JIT cache are built from these same sources. Everything a kernel needs from
// a tensor (dtype, device, sizes, strides, data, new tensors) goes through this header,
// and so does every error a kernel raises (Note [Typed errors]).
#pragma once

#include <cstdint>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/Layout.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>
#include <torch/headeronly/util/HeaderOnlyArrayRef.h>
#include <torch/headeronly/version.h>

namespace core_ops {

using Tensor = torch::stable::Tensor;
// A list argument (Tensor[] in the schema): TORCH_BOX unboxes it into a vector that
// lives for the call, and hands the kernel this view of it.
using TensorList = torch::headeronly::HeaderOnlyArrayRef<Tensor>;
using OptionalTensor = std::optional<Tensor>;
using ScalarType = torch::headeronly::ScalarType;
using Device = torch::stable::Device;
using DeviceType = torch::headeronly::DeviceType;
using Half = torch::headeronly::Half;
using BFloat16 = torch::headeronly::BFloat16;
using Sizes = torch::headeronly::IntHeaderOnlyArrayRef;

// ---- words: dtypes, devices, shapes as Python prints them ---------------------------

inline const char* dtype_short_name(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return "float32";
    case ScalarType::Double: return "float64";
    case ScalarType::Half: return "float16";
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::Int: return "int32";
    case ScalarType::Long: return "int64";
    case ScalarType::Short: return "int16";
    case ScalarType::Byte: return "uint8";
    case ScalarType::Char: return "int8";
    case ScalarType::Bool: return "bool";
    case ScalarType::ComplexFloat: return "complex64";
    case ScalarType::ComplexDouble: return "complex128";
    case ScalarType::ComplexHalf: return "complex32";
    case ScalarType::Float8_e5m2: return "float8_e5m2";
    case ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    case ScalarType::Float8_e5m2fnuz: return "float8_e5m2fnuz";
    case ScalarType::Float8_e4m3fnuz: return "float8_e4m3fnuz";
    case ScalarType::Float8_e8m0fnu: return "float8_e8m0fnu";
    default: return torch::headeronly::toString(t);
  }
}

// A dtype as Python spells it ("torch.float16"), so C++ and Python errors read alike.
inline std::string dtype_name(ScalarType t) { return std::string("torch.") + dtype_short_name(t); }

inline std::string device_name(const Device& d) {
  std::string type;
  switch (d.type()) {
    case DeviceType::CPU: type = "cpu"; break;
    case DeviceType::CUDA: type = "cuda"; break;
    case DeviceType::Meta: type = "meta"; break;
    default: type = "device type " + std::to_string(static_cast<int>(d.type()));
  }
  return d.has_index() && d.type() != DeviceType::CPU ? type + ":" + std::to_string(d.index()) : type;
}

// What the messages stream: dtypes, devices and shapes in Python's words.
struct Words {
  std::ostringstream out;
  template <typename T>
  Words& operator<<(const T& v) { out << v; return *this; }
  // As Python's f"{v:g}": C++ streams a NaN with its sign bit ("-nan"), Python never.
  Words& operator<<(double v) {
    if (v != v) out << "nan"; else out << v;
    return *this;
  }
  Words& operator<<(float v) { return *this << static_cast<double>(v); }
  Words& operator<<(ScalarType t) { out << dtype_name(t); return *this; }
  Words& operator<<(const Device& d) { out << device_name(d); return *this; }
  Words& operator<<(Sizes s) {
    out << "[";
    for (size_t i = 0; i < s.size(); ++i) out << (i ? ", " : "") << s[i];
    out << "]";
    return *this;
  }
};

template <typename... Args>
std::string words(const Args&... args) {
  Words w;
  (w << ... << args);
  return w.out.str();
}

// Note [Typed errors]: a kernel's refusal reaches Python as the exception the
// reference kernel raises for the same call: ValueError for a wrong size, device or
// value, TypeError for a wrong dtype or kind. Which C++ exception torch turns into which
// Python class changes between releases (a std::invalid_argument is a ValueError up to
// 2.14, a RuntimeError on 2.15; nothing becomes a TypeError), so the class travels in
// the message, as a "[ValueError] " / "[TypeError] " prefix that core_ops/_schemas.py's
// op() turns back into the class and removes. An op called as torch.ops.core_ops.*
// raises RuntimeError with the prefix.
[[noreturn]] inline void raise_value_error(const std::string& message) {
  throw std::runtime_error("[ValueError] " + message);
}
[[noreturn]] inline void raise_type_error(const std::string& message) {
  throw std::runtime_error("[TypeError] " + message);
}

}  // namespace core_ops

#define CORE_OPS_CHECK_VALUE(cond, ...) \
  do {                                  \
    if (!(cond)) ::core_ops::raise_value_error(::core_ops::words(__VA_ARGS__)); \
  } while (0)
#define CORE_OPS_CHECK_TYPE(cond, ...) \
  do {                                 \
    if (!(cond)) ::core_ops::raise_type_error(::core_ops::words(__VA_ARGS__)); \
  } while (0)
// A broken invariant of core_ops itself, not of the call.
#define CORE_OPS_ASSERT(cond, ...) \
  do {                             \
    if (!(cond)) throw std::logic_error(::core_ops::words("core_ops internal error: ", __VA_ARGS__)); \
  } while (0)

namespace core_ops {

// ---- reading tensors ---------------------------------------------------------------

template <typename T>
T* data(const Tensor& t) { return static_cast<T*>(t.data_ptr()); }

// Note [Dtype lookup]: the stable Tensor's scalar_type() turns torch's dtype code into
// the enum by comparing it with one shim call per dtype it knows, in a fixed order:
// seven calls for float32, thirteen for bfloat16. The list checks ask it of every
// tensor of every list, which made a 200-tensor multi_tensor_scale_ 50 us slower than
// the ATen build of the same kernel. dtype_of asks for the code once and looks it up
// among the dtypes the kernels take, whose codes are asked once per process; any other
// dtype goes the long way. Kernels call dtype_of, never scalar_type()
// (tests/test_build.py checks).
inline ScalarType dtype_of(const Tensor& t) {
  struct Code {
    int32_t code;
    ScalarType dtype;
  };
  static const Code known[] = {
      {aoti_torch_dtype_float32(), ScalarType::Float},  {aoti_torch_dtype_bfloat16(), ScalarType::BFloat16},
      {aoti_torch_dtype_float16(), ScalarType::Half},   {aoti_torch_dtype_float64(), ScalarType::Double},
      {aoti_torch_dtype_int32(), ScalarType::Int},      {aoti_torch_dtype_int64(), ScalarType::Long},
      {aoti_torch_dtype_bool(), ScalarType::Bool},      {aoti_torch_dtype_uint8(), ScalarType::Byte},
  };
  int32_t code = 0;
  if (aoti_torch_get_dtype(t.get(), &code) == AOTI_TORCH_SUCCESS) {
    for (const Code& k : known) {
      if (k.code == code) return k.dtype;
    }
  }
  return t.scalar_type();
}

// The layout of a tensor that is not strided, as Python prints it ("torch.sparse_coo",
// as _validate.py's check_lists words it); nullptr for a
// strided one. torch 2.10's headers have no Tensor::layout() (its ABI has the shim, so
// a library built against newer headers asks it): built against them, every tensor
// counts as strided here and a sparse one is refused by the Python checks that run
// before any kernel (_validate.tensor_list), or by torch when its data is read.
inline const char* non_strided_layout(const Tensor& t) {
#if TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 11
  using torch::headeronly::Layout;
  switch (t.layout()) {
    case Layout::Strided: return nullptr;
    case Layout::Sparse: return "torch.sparse_coo";
    case Layout::SparseCsr: return "torch.sparse_csr";
    case Layout::SparseCsc: return "torch.sparse_csc";
    case Layout::SparseBsr: return "torch.sparse_bsr";
    case Layout::SparseBsc: return "torch.sparse_bsc";
    case Layout::Mkldnn: return "torch._mkldnn";
    case Layout::Jagged: return "torch.jagged";
    default: return "non-strided";
  }
#else
  (void)t;
  return nullptr;
#endif
}

// Dense: every element at its own address, the addresses one block (contiguous or a
// permutation of it, channels_last included): what the flat kernels walk.
inline bool is_dense(const Tensor& t) {
  if (t.is_contiguous()) return true;  // one shim call for the common case
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  std::vector<size_t> order(sizes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  // Dimensions by stride, smallest first; a size-1 dimension's stride does not matter.
  for (size_t i = 1; i < order.size(); ++i) {
    for (size_t j = i; j > 0 && strides[order[j]] < strides[order[j - 1]]; --j) std::swap(order[j], order[j - 1]);
  }
  int64_t expected = 1;
  for (size_t k : order) {
    if (sizes[k] == 1) continue;
    if (strides[k] != expected) return false;
    expected *= sizes[k];
  }
  return true;
}

// One element read on the host (a scalar argument on the CPU: lr, grad_scale).
inline double item(const Tensor& t) {
  switch (dtype_of(t)) {
    case ScalarType::Float: return *data<float>(t);
    case ScalarType::Double: return *data<double>(t);
    case ScalarType::Half: return static_cast<float>(*data<Half>(t));
    case ScalarType::BFloat16: return static_cast<float>(*data<BFloat16>(t));
    case ScalarType::Int: return *data<int32_t>(t);
    case ScalarType::Long: return static_cast<double>(*data<int64_t>(t));
    default: raise_type_error(words("expected a floating or integer scalar tensor, got ", dtype_of(t)));
  }
}

// torch.is_floating_point: every floating dtype, the float8 ones included.
inline bool is_floating(ScalarType t) {
  switch (t) {
    case ScalarType::Float:
    case ScalarType::Double:
    case ScalarType::Half:
    case ScalarType::BFloat16:
    case ScalarType::Float8_e5m2:
    case ScalarType::Float8_e4m3fn:
    case ScalarType::Float8_e5m2fnuz:
    case ScalarType::Float8_e4m3fnuz:
    case ScalarType::Float8_e8m0fnu:
      return true;
    default:
      return false;
  }
}

// a and b, of equal sizes, walk memory in the same order: equal strides on every dim
// of more than one element (a size-1 dim's stride is never used, and torch leaves it
// arbitrary: torch.randn(17, 1).t() is contiguous with strides (1, 1)).
inline bool same_layout(const Tensor& a, const Tensor& b) {
  const auto sizes = a.sizes();
  const auto sa = a.strides(), sb = b.strides();
  if (sa.equals(sb)) return true;
  if (sa.size() != sb.size()) return false;
  if (a.numel() == 0) return true;  // nothing to walk
  for (size_t d = 0; d < sa.size(); ++d) {
    if (sizes[d] != 1 && sa[d] != sb[d]) return false;
  }
  return true;
}

inline bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.data_ptr() == b.data_ptr() && dtype_of(a) == dtype_of(b) && a.sizes().equals(b.sizes()) &&
         a.strides().equals(b.strides());
}

// Whether b covers some but not all of a's memory, starts elsewhere inside it, or covers
// the same memory in another order (ATen's get_overlap_status(a, b) == Partial): the
// kernels read and write in chunks, in parallel, so such a pair's result would depend on
// the order. Judged, as ATen does, only for dense tensors (others: not partial).
inline bool partly_overlaps(const Tensor& a, const Tensor& b) {
  if (!is_dense(a) || !is_dense(b) || a.numel() == 0 || b.numel() == 0) return false;
  const auto* a0 = static_cast<const char*>(a.data_ptr());
  const auto* b0 = static_cast<const char*>(b.data_ptr());
  const auto* a1 = a0 + a.numel() * a.element_size();
  const auto* b1 = b0 + b.numel() * b.element_size();
  // The same memory: in place when walked in the same order (the same strides), else
  // partial (m and m.t(): an element is written before another reads it).
  if (a0 == b0 && a1 == b1) return !(a.sizes().equals(b.sizes()) && same_layout(a, b));
  return a0 < b1 && b0 < a1;
}

// ---- new tensors -------------------------------------------------------------------

// Note [Allocation without the dispatcher]: torch::stable::empty calls aten::empty
// through torch's boxed dispatcher, which looks the op up by name and boxes its six
// arguments on every call; aoti_torch_empty_strided allocates directly. Contiguous,
// uninitialized, as empty().
inline Tensor empty(Sizes sizes, ScalarType dtype, const Device& device) {
  std::vector<int64_t> strides(sizes.size());
  int64_t step = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = step;
    step *= sizes[i] > 1 ? sizes[i] : 1;
  }
  using torch::stable::detail::from;
  using torch::stable::detail::to;
  AtenTensorHandle handle = nullptr;
  const int32_t index = device.type() == DeviceType::CPU ? 0 : device.index();
  if (aoti_torch_empty_strided(static_cast<int64_t>(sizes.size()), sizes.data(), strides.data(),
                               to<int32_t>(from(dtype)), to<int32_t>(from(device.type())), index,
                               &handle) != AOTI_TORCH_SUCCESS) {
    return torch::stable::empty(sizes, dtype, std::nullopt, device);  // torch says why
  }
  return Tensor(handle);
}

inline Tensor empty(std::initializer_list<int64_t> sizes, ScalarType dtype, const Device& device) {
  return empty(Sizes(sizes.begin(), sizes.end()), dtype, device);
}

inline Tensor zeros(std::initializer_list<int64_t> sizes, ScalarType dtype, const Device& device) {
  Tensor t = empty(sizes, dtype, device);
  torch::stable::zero_(t);
  return t;
}

inline Tensor empty_like(const Tensor& t) { return torch::stable::empty_like(t); }

// A contiguous copy, or t itself when it is contiguous.
inline Tensor contiguous(const Tensor& t) { return t.is_contiguous() ? t : torch::stable::contiguous(t); }

inline void copy_(Tensor& dst, const Tensor& src) { torch::stable::copy_(dst, src); }

}  // namespace core_ops
