"""Tiers 2 and 3 of Note [Backend tiers] (torch_fused.py), registered as each op's
CompositeExplicitAutograd kernel: torch's fused kernel where the op has one and the
call fits it, else the pure-PyTorch reference. A native kernel, once loaded, takes
its device's own key over this one."""

import torch

from . import torch_fused
from .reference import KERNELS as REFERENCE

KERNELS = {**REFERENCE, **torch_fused.KERNELS}

for _name, _fn in KERNELS.items():
    torch.library.impl(f"core_ops::{_name}", "CompositeExplicitAutograd")(_fn)
