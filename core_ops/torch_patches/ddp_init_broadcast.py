"""torch.nn.parallel.DistributedDataParallel broadcasts the params of rank 0 when it
is built; at O2 amp's fp32 masters must follow (Note [Masters follow DDP's broadcast]
in amp/masters.py). torch gives no hook there, so its ``__init__`` is wrapped once, when
an ``initialize`` first makes masters: after torch's own construction, every function
given to ``follow`` runs (amp's: ``masters.broadcast``) whenever torch synced the params
(``init_sync``). Idempotent; ``uninstall`` undoes it."""

from __future__ import annotations

import functools
import inspect

import torch
import torch.distributed as dist

from ._patch import Patch

WHEN_OFF = ("torch's DistributedDataParallel gives each rank rank 0's half weights but leaves amp's O2 masters as "
            "each rank made them: give every rank the same float32 weights before amp.initialize (one seed, or a "
            "loaded checkpoint), or use core_ops.parallel.DistributedDataParallel, which broadcasts the masters "
            "itself.")
PATCH = Patch(__name__, ("2.10", "2.16"), "tools/upstream/ddp_no_hook_after_init_broadcast.py", WHEN_OFF)

_MARK = "_core_ops_syncs_amp_masters"
# (module, process_group, src, skip): run after torch broadcast ``module``'s params from
# global rank ``src``, ``skip`` being the names of the params DDP ignores.
_FOLLOWERS = []


def follow(fn):
    """Adds ``fn(module, process_group, src, skip)`` to what runs after DDP's broadcast
    (once per ``fn``); ``install`` puts the wrap in place."""
    if fn not in _FOLLOWERS:
        _FOLLOWERS.append(fn)


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
            for fn in _FOLLOWERS:
                fn(self.module, self.process_group, src, skip=self.parameters_to_ignore)

    setattr(__init__, _MARK, True)
    return __init__


def installed():
    return getattr(torch.nn.parallel.DistributedDataParallel.__init__, _MARK, False)


def install():
    """Wraps torch's DistributedDataParallel.__init__ (once); returns whether it is
    wrapped (not where torch has no torch.distributed, or ``PATCH`` is not active)."""
    if not dist.is_available() or not PATCH.active():
        return False
    cls = torch.nn.parallel.DistributedDataParallel
    if not installed():
        cls.__init__ = _wrap(cls.__init__)
    return True


def uninstall():
    cls = torch.nn.parallel.DistributedDataParallel
    if installed():
        cls.__init__ = cls.__init__.__wrapped__
