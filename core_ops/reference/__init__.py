"""Pure-PyTorch kernels: the specification of every op, the fallback on any device, and
the oracle of the tests and benchmarks. ``KERNELS`` maps op name to function."""

import torch

from . import adagrad, adam, lamb, loss_scale, multi_tensor, norms, novograd, sgd, sync_batch_norm

KERNELS = {**multi_tensor.KERNELS, **loss_scale.KERNELS, **adam.KERNELS, **sgd.KERNELS,
           **adagrad.KERNELS, **lamb.KERNELS, **novograd.KERNELS,
           **sync_batch_norm.KERNELS, **norms.KERNELS}

# Registered for every device; a native kernel, once loaded, overrides its device.
for _name, _fn in KERNELS.items():
    torch.library.impl(f"core_ops::{_name}", "CompositeExplicitAutograd")(_fn)
