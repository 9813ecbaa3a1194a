// Host/device qualifiers for the per-element math shared by the CPU and CUDA kernels.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define CORE_OPS_HD __host__ __device__ __forceinline__
#else
#define CORE_OPS_HD inline
#endif
