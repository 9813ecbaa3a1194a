"""Collectives on many tensors at once: each (device, dtype) group flattened into one
buffer, one collective a group. Below both core_ops.parallel (DDP's broadcast and
allreduce) and core_ops.amp (the masters' broadcast), so neither imports the other
for them."""

from collections import defaultdict

import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


def flat_call(tensors, call):
    """Runs ``call(flat)`` on each (device, dtype) group of ``tensors`` flattened into
    one buffer, then copies the buffer's values back: one collective per group."""
    by_key = defaultdict(list)
    for t in tensors:
        by_key[(t.device, t.dtype)].append(t)
    for ts in by_key.values():
        flat = _flatten_dense_tensors(ts)
        call(flat)
        for t, value in zip(ts, _unflatten_dense_tensors(flat, ts)):
            t.copy_(value)


def flat_all_reduce(tensors, group, scale=1.0):
    """Sums ``tensors`` across ``group`` in place, then multiplies by ``scale``."""
    def reduce(flat):
        dist.all_reduce(flat, group=group)
        if scale != 1.0:
            flat.mul_(scale)
    flat_call(tensors, reduce)


def flat_broadcast(tensors, group, src):
    """Overwrites ``tensors`` with global rank ``src``'s."""
    flat_call(tensors, lambda flat: dist.broadcast(flat, src, group=group))
