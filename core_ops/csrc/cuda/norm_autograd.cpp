// The norm ops' C++ autograd for CUDA tensors (core_ops/norm_autograd.h says why).
// Host code only: compiled by the host compiler, not nvcc.
#include <core_ops/norm_autograd.h>

TORCH_LIBRARY_IMPL(core_ops, AutogradCUDA, m) { core_ops::norm_autograd::register_kernels(m); }
