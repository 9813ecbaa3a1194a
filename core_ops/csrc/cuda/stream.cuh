// What a CUDA launcher needs from torch besides tensors (core_ops/tensor.h): the device
// guard, torch's current stream and the checks after a launch or a runtime call, all
// through the stable ABI (Note [Stable ABI] in tensor.h).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>
#include <torch/csrc/stable/accelerator.h>

#include <core_ops/tensor.h>

// Note [Current CUDA stream]: torch's stable accelerator API names a stream by its
// c10 StreamId, which is the cudaStream_t only for the default stream and external
// ones: a stream from torch's pool (torch.cuda.Stream(), the DDP overlap's side
// streams) has an id that encodes its pool slot. The cudaStream_t itself comes from
// the AOTI shim's aoti_torch_get_current_cuda_stream, exported by libtorch_cuda since
// torch 2.3 and kept there for AOTInductor's compiled models; torch's header declares
// it only when USE_CUDA is defined, so it is declared here (the same declaration: a
// build defining USE_CUDA sees it twice, which C++ allows).
extern "C" AOTITorchError aoti_torch_get_current_cuda_stream(int32_t device_index, void** ret_stream);

namespace core_ops::cuda {

using DeviceIndex = torch::stable::accelerator::DeviceIndex;
// Makes a device current for a launcher's scope, restoring the previous one after.
using DeviceGuard = torch::stable::accelerator::DeviceGuard;

// The stream torch runs work for `device` on now (Note [Current CUDA stream]).
inline cudaStream_t current_stream(DeviceIndex device) {
  void* stream = nullptr;
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(device, &stream));
  return static_cast<cudaStream_t>(stream);
}

// After a launch: a bad configuration (too many threads, too much shared memory, an
// argument block over the limit, no kernel image for this GPU) fails the launch
// itself, and only cudaGetLastError reports it.
inline void check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw std::runtime_error(words("CUDA error launching ", kernel, ": ", cudaGetErrorString(err)));
  }
}

inline void check_runtime(cudaError_t err, const char* call) {
  if (err != cudaSuccess) throw std::runtime_error(words("CUDA error in ", call, ": ", cudaGetErrorString(err)));
}

}  // namespace core_ops::cuda
