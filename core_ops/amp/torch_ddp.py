"""torch.nn.parallel.DistributedDataParallel broadcasts the params of rank 0 when it
is built; at O2 the fp32 masters must follow (Note [Masters follow DDP's broadcast] in
masters.py). torch gives no hook there, so its ``__init__`` is wrapped once, when an
``initialize`` first makes masters: after torch's own construction, the masters of the
wrapped module's params are broadcast on the DDP's process group from its rank 0,
whenever torch synced the params (``init_sync``). Idempotent; ``uninstall`` undoes it."""

from __future__ import annotations

import functools
import inspect

import torch
import torch.distributed as dist

from . import masters

_MARK = "_core_ops_syncs_amp_masters"


def _synced(original, ddp, args, kwargs):
    """Whether torch's ``__init__`` broadcast the params: ``init_sync`` (torch 2.5+)
    was not turned off, and it did not return before the sync (every param delayed)."""
    try:
        bound = inspect.signature(original).bind(ddp, *args, **kwargs)
    except TypeError:  # torch raised already for such arguments
        return False
    if not bound.arguments.get("init_sync", True):
        return False
    return not getattr(ddp, "_delay_all_reduce_all_params", False)


def _wrap(original):
    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if _synced(original, self, args, kwargs) and dist.get_world_size(self.process_group) > 1:
            src = dist.get_global_rank(self.process_group, 0)
            masters.broadcast(self.module, self.process_group, src, skip=self.parameters_to_ignore)

    setattr(__init__, _MARK, True)
    return __init__


def install():
    """Wraps torch's DistributedDataParallel.__init__ (once)."""
    if not dist.is_available():
        return
    cls = torch.nn.parallel.DistributedDataParallel
    if not getattr(cls.__init__, _MARK, False):
        cls.__init__ = _wrap(cls.__init__)


def uninstall():
    cls = torch.nn.parallel.DistributedDataParallel
    if getattr(cls.__init__, _MARK, False):
        cls.__init__ = cls.__init__.__wrapped__
