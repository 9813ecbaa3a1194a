// Outputs too large to stay in cache (kStreamFrom bytes and up), written two ways
// faster than a plain loop of stores writes them:
// - Non-temporal ("streaming") stores. A normal store first reads the cache line it
//   writes (write-allocate), so filling an output costs a read and a write of it; a
//   streaming store writes whole lines and skips the read. On this project's 2-core
//   machine a 128 MB scale-and-copy ran at 23 GB/s with normal stores and 30 GB/s with
//   streaming ones. They need vector-aligned addresses and are weakly ordered: a
//   thread fences (stream_fence) before another reads what it wrote.
// - Huge pages. A fresh output of this size is new memory from the OS, which faults it
//   in a 4 KiB page at a time on first write; filling a fresh 128 MB tensor took 55 ms
//   that way and 16 ms when its memory was first advised to use 2 MiB pages
//   (advise_huge_pages; Linux's transparent huge pages, where enabled).
// An output that fits in cache is better stored normally: the next op reads it there.
#pragma once

#include <cstdint>
#include <type_traits>

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include <ATen/core/Tensor.h>

#include "multi_tensor_apply.h"

namespace core_ops::cpu {

// Outputs of at least this many bytes count as large: past the last-level cache of the
// CPUs this runs on (32 MB here), so no later op finds them in cache anyway.
constexpr int64_t kStreamFrom = int64_t(32) << 20;

// Whether `rows` rows of `hidden` T starting at `base` are worth streaming and can be:
// every row start on a vector boundary, which holds for the usual hidden sizes
// (multiples of 16 floats or 32 halves) of an aligned tensor.
template <typename T>
bool stream_rows(const T* base, int64_t rows, int64_t hidden) {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  constexpr int64_t align = sizeof(fVec);
  return rows * hidden * int64_t(sizeof(T)) >= kStreamFrom && reinterpret_cast<uintptr_t>(base) % align == 0 &&
         hidden * int64_t(sizeof(T)) % align == 0;
#else
  (void)base, (void)rows, (void)hidden;
  return false;
#endif
}

// VecIO<T>::store with streaming stores; p is vector-aligned (stream_rows).
template <typename T>
inline void stream_store(T* p, const fVec& a, const fVec& b) {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  if constexpr (std::is_same_v<T, float>) {
#if defined(CPU_CAPABILITY_AVX512)
    _mm512_stream_ps(p, a);
    _mm512_stream_ps(p + fVec::size(), b);
#else
    _mm256_stream_ps(p, a);
    _mm256_stream_ps(p + fVec::size(), b);
#endif
  } else {
    const auto v = at::vec::convert_from_float<T>(a, b);
#if defined(CPU_CAPABILITY_AVX512)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(p), v);
#else
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), v);
#endif
  }
#else
  VecIO<T>::store(p, a, b);
#endif
}

// A store that streams when `stream` is set (one branch, the same way every row).
template <typename T>
inline void store2(T* p, const fVec& a, const fVec& b, bool stream) {
  if (stream) {
    stream_store(p, a, b);
  } else {
    VecIO<T>::store(p, a, b);
  }
}

inline void stream_fence() {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  _mm_sfence();
#endif
}

// Asks for 2 MiB pages over the whole 2 MiB pages inside a large output's memory,
// before anything is written to it. Memory already in use keeps its pages; where
// huge pages are off or unsupported the call does nothing.
inline void advise_huge_pages(const at::Tensor& out) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const int64_t bytes = out.numel() * int64_t(out.element_size());
  if (bytes < kStreamFrom) return;
  constexpr uintptr_t huge = uintptr_t(2) << 20;
  const uintptr_t p = reinterpret_cast<uintptr_t>(out.data_ptr());
  const uintptr_t begin = (p + huge - 1) & ~(huge - 1), end = (p + uintptr_t(bytes)) & ~(huge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);  // advice only: errors ignored
#else
  (void)out;
#endif
}

}  // namespace core_ops::cpu
