// CUDA multi-tensor apply: cut every tensor of the lists into chunks of kChunkSize
// elements, one thread block per chunk, and describe a batch of chunks to a kernel
// entirely through its argument struct, so a list of 2000 tensors costs a handful of
// launches and no host-to-device copy. Besides the lists it walks (up to kMaxDepth),
// a launch can name per-tensor scalars: one-element tensors, one per tensor, such as
// an optimizer's step counts. Also the per-thread load/store helpers, the found-inf
// flag and the block reduction shared by the kernels.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include <core_ops/macros.h>
#include <core_ops/tensor.h>
#include <core_ops/tensor_lists.h>

#include "stream.cuh"

namespace core_ops::cuda {

constexpr int kBlockSize = 512;
// Elements a thread moves per step: one 16-byte load for float, 8 for half/bfloat16.
constexpr int kILP = 4;
// A multiple of kILP (so every chunk of an aligned tensor starts aligned) and small
// enough to fit an int, so in-chunk offsets are 32-bit while chunk starts are int64.
constexpr int64_t kChunkSize = 65536;
static_assert(kChunkSize % (kILP * kBlockSize) == 0, "a chunk is whole steps of a block");

// The launch descriptor travels as a kernel argument. CUDA 12.1+ accepts 32764 bytes
// of arguments instead of 4096 (on Volta+ with an R530+ driver; a driver too old
// fails the launch check loudly, and torch's CUDA 13 builds need a newer one anyway).
// We use about 20 KB there: 2048 chunks a launch keep an H100/H200 (132 SMs x 4
// resident 512-thread blocks) busy for ~4 waves, where 320 chunks (what fits 4 KB)
// fill 60% of one wave and leave memory bandwidth idle at every launch boundary; the
// rest of the 32 KB is not worth the larger per-launch copy. Older toolkits get the
// classic limit, less room for the functor's own arguments;
// -DCORE_OPS_SMALL_KERNEL_ARGS forces it, to compare the two on a given GPU.
#if defined(CUDART_VERSION) && CUDART_VERSION >= 12010 && !defined(CORE_OPS_SMALL_KERNEL_ARGS)
constexpr size_t kMetaBytes = 20 * 1024;
constexpr int kMaxChunks = 2048;
constexpr size_t kKernelArgBytes = 32764;
#else
constexpr size_t kMetaBytes = 4096 - 256;
constexpr int kMaxChunks = 320;
constexpr size_t kKernelArgBytes = 4096;
#endif

// Lists one launch can walk: Adam's params, grads, exp_avg, exp_avg_sq,
// max_exp_avg_sq and master weights.
constexpr int kMaxDepth = 6;

// Tensors one launch can name, given kPointers addresses per tensor (walked lists
// plus per-tensor scalars): what the budget leaves after the chunk table, capped at
// 256 so the chunk table's tensor index fits a byte. (With the large budget: 256 up
// to 3 pointers, 159 for Adam's 6 lists and step; with the small one 139, 93, 69 for
// depths 1 to 3, 34 for Adam's 7. Depths 1 to 3 keep the counts they always had.)
template <int kPointers>
constexpr int max_tensors() {
  constexpr size_t left = kMetaBytes - kMaxChunks * (sizeof(int32_t) + sizeof(uint8_t)) - sizeof(int64_t);
  constexpr size_t fit = left / (sizeof(void*) * kPointers + sizeof(int64_t));
  return fit < 256 ? static_cast<int>(fit) : 256;
}

// Largest members first: no padding between the arrays. addresses[0, kDepth) are
// the walked lists; addresses[kDepth + j] is per-tensor scalar j: the tensor's own
// one-element tensor, named with it in every launch that covers one of its chunks
// (a tensor cut between launches is named again, scalars included), so the kernel
// finds it by slot like the tensor's data, with no table to copy to the device.
template <int kDepth, int kScalars = 0>
struct TensorListMeta {
  static_assert(kDepth >= 1 && kDepth <= kMaxDepth && kScalars >= 0, "unsupported depth");
  static constexpr int kMaxTensors = max_tensors<kDepth + kScalars>();
  void* addresses[kDepth + kScalars][kMaxTensors];
  int64_t sizes[kMaxTensors];
  int64_t first_chunk;                // global id of this launch's chunk 0
  int32_t chunk_index[kMaxChunks];    // chunk of its tensor; * kChunkSize in int64
  uint8_t chunk_tensor[kMaxChunks];   // slot in addresses / sizes
};
static_assert(sizeof(TensorListMeta<1>) <= kMetaBytes && sizeof(TensorListMeta<3>) <= kMetaBytes &&
                  sizeof(TensorListMeta<kMaxDepth>) <= kMetaBytes &&
                  sizeof(TensorListMeta<kMaxDepth, 1>) <= kMetaBytes,
              "the launch descriptor must fit the kernel-argument limit");

// __grid_constant__ lets the kernel index the descriptor with runtime indices in
// place; a plain by-value parameter would first be copied to local memory.
template <int kDepth, int kScalars, typename Op>
__global__ void __launch_bounds__(kBlockSize)
    multi_tensor_apply_kernel(const __grid_constant__ TensorListMeta<kDepth, kScalars> meta,
                              const Op op) {
  const int t = meta.chunk_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(meta.chunk_index[blockIdx.x]) * kChunkSize;
  const int64_t rest = meta.sizes[t] - begin;
  const int len = static_cast<int>(rest < kChunkSize ? rest : kChunkSize);
  op(meta, t, begin, len, meta.first_chunk + blockIdx.x);
}

// Runs op(meta, tensor_slot, chunk_begin, chunk_len, global_chunk_id) once per block
// over every chunk of lists[0]'s tensors; all lists must hold contiguous tensors of
// the same numel index by index on one CUDA device. Global chunk ids count the chunks
// of all tensors in list order (empty tensors have none), so the chunks of one tensor
// are consecutive. scalars[j][i] is a one-element tensor the kernel reads (or writes)
// as tensor i's scalar j, at meta.addresses[kDepth + j][slot]. Launched on torch's
// current stream of that device, made current for the call.
template <int kDepth, int kScalars, typename Op>
void multi_tensor_apply(const std::array<TensorList, kDepth>& lists,
                        const std::array<TensorList, kScalars>& scalars, const Op& op) {
  using Meta = TensorListMeta<kDepth, kScalars>;
  static_assert(sizeof(Meta) + sizeof(Op) <= kKernelArgBytes,
                "the launch descriptor and the functor must fit the kernel-argument limit");
  const TensorList first = lists[0];
  if (first.empty()) return;
  for (int d = 1; d < kDepth; ++d) {
    CORE_OPS_ASSERT(lists[d].size() == first.size(), "list ", d, " has ", lists[d].size(), " tensors, list 0 ",
                    first.size());
  }
  for (int j = 0; j < kScalars; ++j) {
    CORE_OPS_ASSERT(scalars[j].size() == first.size(), "scalars ", j, " has ", scalars[j].size(),
                    " tensors, list 0 ", first.size());
  }

  const DeviceIndex device = first[0].get_device_index();
  const DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  Meta meta;
  meta.first_chunk = 0;
  int ntensors = 0, nchunks = 0;
  auto launch = [&] {
    multi_tensor_apply_kernel<kDepth, kScalars, Op><<<nchunks, kBlockSize, 0, stream>>>(meta, op);
    check_launch("multi_tensor_apply_kernel");
    meta.first_chunk += nchunks;
    ntensors = nchunks = 0;
  };

  for (size_t t = 0; t < first.size(); ++t) {
    const int64_t numel = first[t].numel();
    const int64_t chunks = (numel + kChunkSize - 1) / kChunkSize;
    CORE_OPS_CHECK_VALUE(chunks <= INT32_MAX, "tensor ", t, " is too large (", numel, " elements)");
    int slot = -1;  // this tensor's slot in the current descriptor
    for (int64_t c = 0; c < chunks; ++c) {
      if (nchunks == kMaxChunks) {
        launch();
        slot = -1;  // a tensor cut between launches is named again in the next one
      }
      if (slot < 0) {
        if (ntensors == Meta::kMaxTensors) launch();
        slot = ntensors++;
        for (int d = 0; d < kDepth; ++d) {
          CORE_OPS_ASSERT(lists[d][t].numel() == numel && lists[d][t].is_contiguous(), "list ", d, "[", t,
                          "] is not contiguous or not the size of list 0's");
          meta.addresses[d][slot] = lists[d][t].data_ptr();
        }
        for (int j = 0; j < kScalars; ++j) {
          CORE_OPS_ASSERT(scalars[j][t].numel() == 1, "scalars ", j, "[", t, "] is not one element");
          meta.addresses[kDepth + j][slot] = scalars[j][t].data_ptr();
        }
        meta.sizes[slot] = numel;
      }
      meta.chunk_index[nchunks] = static_cast<int32_t>(c);
      meta.chunk_tensor[nchunks] = static_cast<uint8_t>(slot);
      ++nchunks;
    }
  }
  if (nchunks > 0) launch();
}

// The lists alone, no per-tensor scalars.
template <int kDepth, typename Op>
void multi_tensor_apply(const std::array<TensorList, kDepth>& lists, const Op& op) {
  multi_tensor_apply<kDepth, 0>(lists, {}, op);
}

// Global chunk id of each tensor's first chunk, plus the total at the end: the layout
// multi_tensor_apply gives a buffer indexed by global chunk id.
inline std::vector<int64_t> chunk_starts(TensorList tensors) {
  std::vector<int64_t> starts(tensors.size() + 1, 0);
  for (size_t t = 0; t < tensors.size(); ++t) {
    starts[t + 1] = starts[t] + (tensors[t].numel() + kChunkSize - 1) / kChunkSize;
  }
  return starts;
}

inline void check_cuda(const Device& device) {
  CORE_OPS_CHECK_VALUE(device.is_cuda(), "the CUDA kernel was given tensors on ", device);
}

// A one-element scale factor as a dtype tensor on the device. The kernels read it
// there, so the host never waits; a dtype change is a device-side cast.
inline Tensor device_scalar(const Tensor& t, const char* name, const Device& device, ScalarType dtype) {
  CORE_OPS_CHECK_VALUE(t.numel() == 1, name, " must be a one-element tensor, got shape ", t.sizes());
  CORE_OPS_CHECK_VALUE(t.device() == device, name, " is on ", t.device(), " but the op runs on ", device);
  return core_ops::contiguous(torch::stable::to(t, dtype));
}

// ---- device helpers -------------------------------------------------------------

template <typename T>
struct alignas(sizeof(T) * kILP) Pack {
  T v[kILP];
};

template <typename T>
__device__ __forceinline__ bool pack_aligned(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % alignof(Pack<T>) == 0;
}

// Elements p[0, n) as acc_t, n <= kILP, zero beyond n; one vector load when the
// pointer allows (the caller checked alignment once per chunk: `vec`).
template <typename acc_t, typename T>
__device__ __forceinline__ void load_pack(acc_t (&r)[kILP], const T* p, int n, bool vec) {
  if (vec && n == kILP) {
    const Pack<T> pk = *reinterpret_cast<const Pack<T>*>(p);
#pragma unroll
    for (int k = 0; k < kILP; ++k) r[k] = static_cast<acc_t>(pk.v[k]);
  } else {
#pragma unroll
    for (int k = 0; k < kILP; ++k) r[k] = k < n ? static_cast<acc_t>(p[k]) : acc_t(0);
  }
}

template <typename T, typename acc_t>
__device__ __forceinline__ void store_pack(T* p, const acc_t (&r)[kILP], int n, bool vec) {
  if (vec && n == kILP) {
    Pack<T> pk;
#pragma unroll
    for (int k = 0; k < kILP; ++k) pk.v[k] = static_cast<T>(r[k]);
    *reinterpret_cast<Pack<T>*>(p) = pk;
  } else {
#pragma unroll
    for (int k = 0; k < kILP; ++k) {
      if (k < n) p[k] = static_cast<T>(r[k]);
    }
  }
}

// This thread's packs of a chunk of len elements, in order: f(i, n) for the pack at
// offset i, n <= kILP elements (only the last may be short).
template <typename F>
__device__ __forceinline__ void for_each_pack(int len, const F& f) {
  for (int i = threadIdx.x * kILP; i < len; i += blockDim.x * kILP) f(i, len - i < kILP ? len - i : kILP);
}

// The caller's found_inf (float32 or int32). Every writer stores 1 and nobody reads
// it in the kernel, so concurrent stores from many threads are a benign race.
struct FoundInf {
  void* ptr;
  bool is_int;

  __device__ __forceinline__ void set() const {
    if (is_int) {
      *static_cast<int32_t*>(ptr) = 1;
    } else {
      *static_cast<float*>(ptr) = 1.f;
    }
  }
};

inline FoundInf found_inf_arg(const Tensor& found_inf) {
  return {found_inf.data_ptr(), dtype_of(found_inf) == ScalarType::Int};
}

// A summed Note [Non-finite probe] is nan exactly when a probed value was not finite.
template <typename T>
__device__ __forceinline__ bool probe_failed(T probe) {
  return !(probe == probe);
}

// Sum over the block, valid in thread 0. The tree depends only on blockDim (a
// multiple of 32), never on scheduling, so the result is bitwise reproducible.
template <typename T>
__device__ T block_sum(T v) {
  __shared__ T warp_sums[32];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x / 32) ? warp_sums[lane] : T(0);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  }
  return v;
}

}  // namespace core_ops::cuda
