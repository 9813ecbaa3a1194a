// Non-temporal ("streaming") stores, for outputs too large to stay in cache. A normal
// store first reads the cache line it writes (write-allocate), so filling an output
// costs a read and a write of it; a streaming store writes whole lines and skips the
// read. On this project's 2-core machine a 128 MB scale-and-copy ran at 23 GB/s with
// normal stores and 30 GB/s with streaming ones (bench/README, "Streaming stores").
// An output that fits in cache is better stored normally: the next op reads it from
// there. So is memory fresh from the OS (glibc maps every block over 32 MB anew): the
// first write to each page faults, the OS zeroes the page through the cache, and a
// normal store then hits that line where a streaming one would evict it (43 -> 51 ms
// for the same 128 MB scale into fresh memory). Streaming stores need vector-aligned addresses, and are weakly ordered: a
// thread fences (stream_fence) before its writes are read by another.
#pragma once

#include <cstdint>
#include <type_traits>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "level.h"
#include "multi_tensor_apply.h"
#include "vec.h"

// Streaming stores take the vectors' registers: the instructions of the level vec.h
// chose (Note [Vector levels]).
#if defined(CORE_OPS_VEC_AVX512) || defined(CORE_OPS_VEC_AVX2)
#include <immintrin.h>
#endif

CORE_OPS_CPU_BEGIN

// Outputs of at least this many bytes are streamed: past the last-level cache of the
// CPUs this runs on (32 MB here), so no later op finds them in cache anyway.
constexpr int64_t kStreamFrom = int64_t(32) << 20;

// Whether the page holding p is in memory already (memory in reuse), not fresh from
// the OS and still to be faulted in. Unknown counts as in memory.
inline bool resident(const void* p) {
#if defined(__linux__)
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  unsigned char in_core = 1;
  mincore(reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) & ~(page - 1)), page, &in_core);
  return in_core & 1;
#else
  (void)p;
  return true;
#endif
}

// Whether `rows` rows of `hidden` T starting at `base` are worth streaming and can be:
// large, in reused memory (its middle page resident: the first page of a fresh block
// holds the allocator's header), and every row start on a vector boundary, which
// holds for the usual hidden sizes (multiples of 16 floats or 32 halves).
template <typename T>
bool stream_rows(const T* base, int64_t rows, int64_t hidden) {
#if defined(CORE_OPS_VEC_AVX512) || defined(CORE_OPS_VEC_AVX2)
  constexpr int64_t align = sizeof(fVec);
  return rows * hidden * int64_t(sizeof(T)) >= kStreamFrom && reinterpret_cast<uintptr_t>(base) % align == 0 &&
         hidden * int64_t(sizeof(T)) % align == 0 && resident(base + rows * hidden / 2);
#else
  (void)base, (void)rows, (void)hidden;
  return false;
#endif
}

// VecIO<T>::store with streaming stores; p is vector-aligned (stream_rows).
template <typename T>
inline void stream_store(T* p, const fVec& a, const fVec& b) {
#if defined(CORE_OPS_VEC_AVX512) || defined(CORE_OPS_VEC_AVX2)
  if constexpr (std::is_same_v<T, float>) {
#if defined(CORE_OPS_VEC_AVX512)
    _mm512_stream_ps(p, a);
    _mm512_stream_ps(p + fVec::size(), b);
#else
    _mm256_stream_ps(p, a);
    _mm256_stream_ps(p + fVec::size(), b);
#endif
  } else {
    const auto v = vec::convert_from_float<T>(a, b);
#if defined(CORE_OPS_VEC_AVX512)
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
#if defined(CORE_OPS_VEC_AVX512) || defined(CORE_OPS_VEC_AVX2)
  _mm_sfence();
#endif
}

CORE_OPS_CPU_END
