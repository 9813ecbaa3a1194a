"""Pure-PyTorch kernels: the specification of every op, the fallback on any device, and
the oracle of the tests and benchmarks. ``KERNELS`` maps op name to function."""

from . import adagrad, adam, adam_compact, lamb, loss_scale, multi_tensor, norms, novograd, sgd, sync_batch_norm

KERNELS = {**multi_tensor.KERNELS, **loss_scale.KERNELS, **adam.KERNELS, **adam_compact.KERNELS, **sgd.KERNELS,
           **adagrad.KERNELS, **lamb.KERNELS, **novograd.KERNELS,
           **sync_batch_norm.KERNELS, **norms.KERNELS}

# Registered, behind torch's fused kernels where an op has one, by core_ops/_fallback.py.
