// Per-element pieces of compact optimizer state, written once for the CPU loops and
// the CUDA kernel; the specification is core_ops/reference/compact_state.py (Note
// [Master remainders], Note [Blockwise 8-bit moments]).
#pragma once

#include <cstdint>
#include <cstring>

#include <core_ops/macros.h>

namespace core_ops {

// Elements per block of 8-bit moments (reference/compact_state.py's BLOCK).
constexpr int kQuantBlock = 256;
constexpr int kMapSize = 256;

CORE_OPS_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
#endif
}

CORE_OPS_HD float bits_float(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
#endif
}

// The float32 master of a bfloat16 param (its bits) and its remainder.
CORE_OPS_HD float join_master(uint16_t param_bits, int16_t remainder) {
  return bits_float((uint32_t(param_bits) << 16) + uint32_t(int32_t(remainder)));
}

// The remainder of `master` beside its rounding `param_bits`: the difference of their
// bits, a tie (+-0x8000) moved one ulp towards the param; 0 for a NaN.
CORE_OPS_HD int16_t remainder_of(float master, uint16_t param_bits) {
  if (master != master) return 0;
  int32_t r = int32_t(float_bits(master) - (uint32_t(param_bits) << 16));
  r = r > 0x7FFF ? 0x7FFF : (r < -0x7FFF ? -0x7FFF : r);
  return int16_t(r);
}

// 1 / absmax of a block, 0 for an all-zero block (every code then decodes to 0).
CORE_OPS_HD float inverse_absmax(float absmax) { return absmax > 0.f ? 1.f / absmax : 0.f; }

// The code of `normalized`: the number of midpoints below it, found by walking up from
// `start` (a count known not to exceed it). mid has kMapSize entries, the last +inf.
CORE_OPS_HD uint8_t code_from(float normalized, const float* mid, int start) {
  int c = start;
  while (c < kMapSize - 1 && mid[c] < normalized) ++c;
  return uint8_t(c);
}

// The midpoints of a map as the reference computes them, then +inf.
CORE_OPS_HD float map_midpoint(const float* map, int j) {
  return j < kMapSize - 1 ? (map[j] + map[j + 1]) * 0.5f : bits_float(0x7F800000u);
}

}  // namespace core_ops
