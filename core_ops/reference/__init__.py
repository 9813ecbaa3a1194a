"""Pure-PyTorch kernels: the specification of every op, the fallback on any device, and
the oracle of the tests and benchmarks. ``KERNELS`` maps op name to function."""

from .._boundary import checked, has_boundary
from . import adagrad, adam, adam_compact, lamb, loss_scale, multi_tensor, norms, novograd, sgd, sync_batch_norm

# Each behind the checks every call of an op with lists meets (Note [Op boundary]) and
# its declared ones (Note [Declared checks]): an optimizer's kernel here is its math alone.
KERNELS = {name: checked(name, fn) if has_boundary(name) else fn
           for name, fn in {**multi_tensor.KERNELS, **loss_scale.KERNELS, **adam.KERNELS, **adam_compact.KERNELS,
                            **sgd.KERNELS, **adagrad.KERNELS, **lamb.KERNELS, **novograd.KERNELS,
                            **sync_batch_norm.KERNELS, **norms.KERNELS}.items()}

# Registered, behind torch's fused kernels where an op has one, by core_ops/_fallback.py.
