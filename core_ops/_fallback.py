"""Backends 3 and 4 of Note [Backends] (native/__init__.py), registered as each op's
CompositeExplicitAutograd kernel: torch's fused kernel where the op has one and the
call fits it, else the pure-PyTorch reference. A native kernel, once loaded, takes
its device's own key over this one."""

import torch

from . import torch_fused
from ._boundary import checked, has_boundary
from .reference import KERNELS as REFERENCE

# The reference kernels come checked (Note [Op boundary]); torch's are checked here.
KERNELS = {**REFERENCE, **{name: checked(name, fn) if has_boundary(name) else fn
                           for name, fn in torch_fused.KERNELS.items()}}

for _name, _fn in KERNELS.items():
    torch.library.impl(f"core_ops::{_name}", "CompositeExplicitAutograd")(_fn)
