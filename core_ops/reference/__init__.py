"""Pure-PyTorch kernels: the specification of every op, the fallback on any device, and
the oracle of the tests and benchmarks. ``KERNELS`` maps op name to function, gathered
from the ``KERNELS`` of every module here: a new op's module is found by itself."""

import importlib
import pkgutil

from .._boundary import checked, has_boundary


def _gathered():
    kernels = {}
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        kernels.update(getattr(importlib.import_module(f"{__name__}.{module}"), "KERNELS", {}))
    return kernels


# Each behind the checks every call of an op with lists meets (Note [Op boundary]) and
# its declared ones (Note [Declared checks]): an optimizer's kernel here is its math alone.
KERNELS = {name: checked(name, fn) if has_boundary(name) else fn for name, fn in _gathered().items()}

# Registered, behind torch's fused kernels where an op has one, by core_ops/_fallback.py.
