"""Pure-PyTorch kernels: the specification of every op, the fallback on any device, and
the oracle of the tests and benchmarks. Importing this package registers them."""

from . import loss_scale, multi_tensor  # noqa: F401  (registration side effects)
