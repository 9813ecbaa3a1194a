// The norm ops' C++ autograd for CPU tensors (core_ops/norm_autograd.h says why).
#include <core_ops/norm_autograd.h>

TORCH_LIBRARY_IMPL(core_ops, AutogradCPU, m) { core_ops::norm_autograd::register_kernels(m); }
