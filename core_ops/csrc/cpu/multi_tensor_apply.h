// CPU multi-tensor apply: cut every tensor of the lists into fixed-size chunks and run
// the chunks of all tensors in one at::parallel_for, so 2000 small tensors cost one
// parallel region, not 2000. Also the vector load/store helpers and the guards that
// keep a malformed call from writing out of bounds (the user-facing checks, with
// friendlier messages, are in core_ops/_validate.py).
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/Exception.h>

#include <core_ops/dispatch.h>

namespace core_ops::cpu {

using fVec = at::vec::Vectorized<float>;

// Elements per chunk: a multiple of every vector width, small enough that 2 threads
// balance on a few MB, large enough that per-chunk bookkeeping is noise.
constexpr int64_t kChunk = 16384;
// Below this many elements in total a parallel region costs more than it saves.
constexpr int64_t kSerialBelow = 32768;

struct Chunk {
  int64_t tensor;
  int64_t begin;
  int64_t end;
};

inline std::vector<Chunk> make_chunks(at::TensorList tensors) {
  std::vector<Chunk> chunks;
  for (int64_t t = 0; t < static_cast<int64_t>(tensors.size()); ++t) {
    const int64_t n = tensors[t].numel();
    for (int64_t b = 0; b < n; b += kChunk) {
      chunks.push_back({t, b, std::min(n, b + kChunk)});
    }
  }
  return chunks;
}

template <typename F>
void parallel_chunks(const std::vector<Chunk>& chunks, F&& f) {
  int64_t total = 0;
  for (const auto& c : chunks) total += c.end - c.begin;
  const int64_t n = static_cast<int64_t>(chunks.size());
  const int64_t grain = total < kSerialBelow ? std::max<int64_t>(n, 1) : 1;
  at::parallel_for(0, n, grain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) f(chunks[i]);
  });
}

// Two float vectors' worth of elements in any of float / half / bfloat16.
constexpr int64_t kWidth = 2 * fVec::size();

template <typename T>
struct VecIO {  // c10::Half and c10::BFloat16
  static void load(const T* p, fVec& a, fVec& b) {
    std::tie(a, b) = at::vec::convert_to_float<T>(at::vec::Vectorized<T>::loadu(p));
  }
  static void store(T* p, const fVec& a, const fVec& b) {
    at::vec::convert_from_float<T>(a, b).store(p);
  }
};

template <>
struct VecIO<float> {
  static void load(const float* p, fVec& a, fVec& b) {
    a = fVec::loadu(p);
    b = fVec::loadu(p + fVec::size());
  }
  static void store(float* p, const fVec& a, const fVec& b) {
    a.store(p);
    b.store(p + fVec::size());
  }
};

inline float horizontal_sum(const fVec& v) {
  return at::vec::vec_reduce_all<float>([](fVec& x, fVec& y) { return x + y; }, v);
}

// ---- guards ---------------------------------------------------------------------

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
                     ts[i].scalar_type(), " but ", name, "[0] has ", dtype);
    TORCH_CHECK_VALUE(ts[i].layout() == c10::kStrided, name, "[", i, "] must be a dense tensor");
  }
}

inline void check_same_numel(at::TensorList a, const char* a_name, at::TensorList b, const char* b_name) {
  for (size_t i = 0; i < a.size(); ++i) {
    TORCH_CHECK_VALUE(a[i].sizes() == b[i].sizes(), b_name, "[", i, "] has shape ", b[i].sizes(),
                      " but ", a_name, "[", i, "] has shape ", a[i].sizes());
  }
}

inline void check_flag(const at::Tensor& found_inf, c10::Device device) {
  TORCH_CHECK_VALUE(found_inf.numel() == 1 && found_inf.device() == device,
                    "found_inf must be a one-element tensor on ", device);
  TORCH_CHECK_TYPE(found_inf.scalar_type() == at::kFloat || found_inf.scalar_type() == at::kInt,
                   "found_inf must be float32 or int32, got ", found_inf.scalar_type());
}

inline void set_flag(const at::Tensor& found_inf) {
  if (found_inf.scalar_type() == at::kFloat) {
    *found_inf.data_ptr<float>() = 1.f;
  } else {
    *found_inf.data_ptr<int32_t>() = 1;
  }
}

inline double read_scalar(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.numel() == 1, name, " must be a one-element tensor, got shape ", t.sizes());
  return t.item<double>();
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

}  // namespace core_ops::cpu
