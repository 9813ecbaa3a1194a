// CPU multi-tensor apply: cut every tensor of the lists into fixed-size chunks and run
// the chunks of all tensors in one torch::stable::parallel_for, so 2000 small tensors
// cost one parallel region, not 2000. Also the vector load/store helpers.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <vector>

#include <torch/csrc/stable/ops.h>

#include <core_ops/dispatch.h>
#include <core_ops/tensor.h>
#include <core_ops/tensor_lists.h>

#include "level.h"
#include "vec.h"

CORE_OPS_CPU_BEGIN

// The primitives of core_ops/primitives.h for float vectors, beside the vector type so
// that the math headers' unqualified calls find them (argument-dependent lookup).
namespace vec {
inline Vectorized<float> vsqrt(const Vectorized<float>& x) { return x.sqrt(); }
inline Vectorized<float> vmax(const Vectorized<float>& a, const Vectorized<float>& b) { return maximum(a, b); }
// RoundTo<T> (Note [Half params without masters]): every lane rounded to T and back.
template <typename T>
Vectorized<float> round_to(T, const Vectorized<float>& x) {
  return std::get<0>(convert_to_float<T>(convert_from_float<T>(x, x)));
}
}  // namespace vec

using fVec = vec::Vectorized<float>;

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

inline std::vector<Chunk> make_chunks(TensorList tensors) {
  std::vector<Chunk> chunks;
  for (int64_t t = 0; t < static_cast<int64_t>(tensors.size()); ++t) {
    const int64_t n = tensors[t].numel();
    for (int64_t b = 0; b < n; b += kChunk) {
      chunks.push_back({t, b, std::min(n, b + kChunk)});
    }
  }
  return chunks;
}

// Note [Dynamic chunk claiming]: threads claim small batches of chunks from a shared
// counter instead of taking a fixed half each, so a thread slowed by another process
// (common on shared machines) does not hold the others back. Results stay
// deterministic: every per-chunk output is stored by chunk index, not by thread.
constexpr int64_t kClaimBatch = 4;

template <typename F>
void parallel_chunks(const std::vector<Chunk>& chunks, F&& f) {
  int64_t total = 0;
  for (const auto& c : chunks) total += c.end - c.begin;
  const int64_t n = static_cast<int64_t>(chunks.size());
  const int64_t workers =
      std::min<int64_t>(torch::stable::get_num_threads(), (n + kClaimBatch - 1) / kClaimBatch);
  if (total < kSerialBelow || workers <= 1) {
    for (const auto& c : chunks) f(c);
    return;
  }
  std::atomic<int64_t> next{0};
  torch::stable::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    for (int64_t b = next.fetch_add(kClaimBatch); b < n; b = next.fetch_add(kClaimBatch)) {
      for (int64_t i = b; i < std::min(n, b + kClaimBatch); ++i) f(chunks[i]);
    }
  });
}

// Two float vectors' worth of elements in any of float / half / bfloat16.
constexpr int64_t kWidth = 2 * fVec::size();

template <typename T>
struct VecIO {  // Half and BFloat16
  static void load(const T* p, fVec& a, fVec& b) {
    std::tie(a, b) = vec::convert_to_float<T>(vec::Vectorized<T>::loadu(p));
  }
  static void store(T* p, const fVec& a, const fVec& b) {
    vec::convert_from_float<T>(a, b).store(p);
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

// What the kernels compute in for elements of T: double for double, float for float,
// half and bfloat16, which (not double) also take the fVec loops, kWidth at a time.
template <typename T>
using acc_of = std::conditional_t<std::is_same_v<T, double>, double, float>;
template <typename T>
constexpr bool kVectorized = !std::is_same_v<T, double>;

template <typename T>
inline void load2(const T* p, fVec& a, fVec& b) { VecIO<T>::load(p, a, b); }
template <typename T>
inline void store2(T* p, const fVec& a, const fVec& b) { VecIO<T>::store(p, a, b); }

inline float horizontal_sum(const fVec& v) {
  return vec::vec_reduce_all<float>([](fVec& x, fVec& y) { return x + y; }, v);
}

inline double read_scalar(const Tensor& t, const char* name) {
  CORE_OPS_CHECK_VALUE(t.numel() == 1, name, " must be a one-element tensor, got shape ", t.sizes());
  return item(t);
}

// Host memory only: the CUDA kernels set the flag on the device.
inline void set_flag(const Tensor& found_inf) {
  if (dtype_of(found_inf) == ScalarType::Float) {
    *data<float>(found_inf) = 1.f;
  } else {
    *data<int32_t>(found_inf) = 1;
  }
}

CORE_OPS_CPU_END
