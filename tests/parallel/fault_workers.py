"""What each rank runs for test_faults.py: constructions that must fail cleanly."""

import os
import time

from core_ops.parallel import DistributedDataParallel
from ddp_workers import mlp


def _construct(model):
    start = time.monotonic()
    try:
        DistributedDataParallel(model)
    except RuntimeError as e:
        return dict(error=str(e), seconds=time.monotonic() - start)
    return dict(error=None, seconds=time.monotonic() - start)


def never_joins(rank, world):
    """Rank 1 is alive but never constructs the wrapper (the group timeout is 3 s)."""
    if rank == 1:
        time.sleep(5)
        return dict(error=None)
    return _construct(mlp(0))


def dies(rank, world):
    """Rank 1 exits right after joining the process group."""
    if rank == 1:
        os._exit(0)
    return _construct(mlp(0))


def mismatched(rank, world):
    return _construct(mlp(0, width=12 + rank))


def buffers_differ(rank, world):
    """Same trainable params, but a BatchNorm whose buffers have another size on rank 1
    (frozen params and buffers are broadcast from rank 0, so they must match too)."""
    from torch import nn
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4 + 2 * rank, affine=False))
    return _construct(model)
