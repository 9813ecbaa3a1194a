"""``apex.parallel`` under the alias: core_ops.parallel, except that
DistributedDataParallel takes Apex's arguments in Apex's order, the ones that did
nothing or are gone included, so that Apex-era call sites run unchanged. core_ops'
own class keeps its shorter signature; code that imports core_ops.parallel directly
drops Apex's retired arguments."""

import sys
import warnings

import torch.distributed

from core_ops import parallel as _core
from core_ops.parallel import (LARC, Reducer, SyncBatchNorm, convert_syncbn_model,  # noqa: F401
                               create_syncbn_process_group, sync_batchnorm)
# apex.parallel.distributed is this module too: flat_dist_call is one of its names.
from core_ops.parallel.distributed import flat_dist_call  # noqa: F401
from core_ops.parallel.options import DDPOptions as _D  # the defaults, declared once

# A package, as Apex's is: ApexAliasFinder serves apex.parallel.LARC, .sync_batchnorm, ...
__path__ = []
# Apex's submodules as attributes, for code that reaches them without importing them:
# apex.parallel.distributed is this module (SUBMODULES in __init__.py).
distributed = sys.modules[__name__]
ReduceOp = torch.distributed.ReduceOp
optimized_sync_batchnorm = sync_batchnorm

__all__ = ["DistributedDataParallel", "LARC", "Reducer", "SyncBatchNorm", "convert_syncbn_model",
           "create_syncbn_process_group"]


class DistributedDataParallel(_core.DistributedDataParallel):
    """Apex's ``DistributedDataParallel(module, message_size=10000000,
    delay_allreduce=False, shared_param=None, allreduce_trigger_params=None,
    retain_allreduce_buffers=False, allreduce_always_fp32=False, num_allreduce_streams=1,
    allreduce_communicators=None, gradient_average=True, gradient_predivide_factor=1.0,
    gradient_average_split_factor=None, prof=False)``, plus core_ops' keyword-only
    ``process_group``, ``broadcast_buffers`` and ``allreduce_dtype``; otherwise
    core_ops.parallel.DistributedDataParallel.

    As in Apex, ``shared_param`` other than None raises (shared params need nothing
    special; ``delay_allreduce=True`` defers all communication to the end of backward),
    and ``gradient_average_split_factor`` is the old name of
    ``gradient_predivide_factor`` (a FutureWarning). ``allreduce_communicators`` (NCCL
    communicator objects) must be None: the reductions run on torch.distributed process
    groups. ``prof`` (Apex's NVTX ranges) is accepted and ignored: torch.profiler
    records the collectives already.
    """

    def __init__(self, module, message_size=_D.message_size, delay_allreduce=_D.delay_allreduce,
                 shared_param=None, allreduce_trigger_params=None,
                 retain_allreduce_buffers=_D.retain_allreduce_buffers,
                 allreduce_always_fp32=_D.allreduce_always_fp32, num_allreduce_streams=_D.num_allreduce_streams,
                 allreduce_communicators=None, gradient_average=_D.gradient_average,
                 gradient_predivide_factor=_D.gradient_predivide_factor, gradient_average_split_factor=None,
                 prof=False, *, process_group=None, broadcast_buffers=_D.broadcast_buffers,
                 allreduce_dtype=_D.allreduce_dtype):
        _check_retired(shared_param, allreduce_communicators)
        if gradient_average_split_factor is not None:
            gradient_predivide_factor = _renamed_split_factor(gradient_average_split_factor,
                                                              gradient_predivide_factor)
        super().__init__(module, message_size, delay_allreduce,
                         allreduce_trigger_params=allreduce_trigger_params,
                         retain_allreduce_buffers=retain_allreduce_buffers,
                         allreduce_always_fp32=allreduce_always_fp32,
                         num_allreduce_streams=num_allreduce_streams,
                         gradient_average=gradient_average,
                         gradient_predivide_factor=gradient_predivide_factor,
                         process_group=process_group, broadcast_buffers=broadcast_buffers,
                         allreduce_dtype=allreduce_dtype)
        self.prof = prof


def _check_retired(shared_param, allreduce_communicators):
    if shared_param is not None:
        raise ValueError(
            f"shared_param={shared_param!r}: Apex removed this argument (overlapping "
            "communication with backward works with shared parameters); leave it out, or pass "
            "delay_allreduce=True to reduce everything once backward is over")
    if allreduce_communicators is not None:
        raise ValueError(
            "allreduce_communicators: core_ops reduces on torch.distributed process groups, "
            "not on NCCL communicator objects; leave it out, and pass process_group=<a group "
            "from torch.distributed.new_group> to reduce over other ranks than all")


def _renamed_split_factor(split_factor, predivide_factor):
    if predivide_factor != 1.0 and predivide_factor != split_factor:
        raise ValueError(
            f"gradient_average_split_factor={split_factor!r} and gradient_predivide_factor="
            f"{predivide_factor!r} name the same setting; give gradient_predivide_factor only")
    warnings.warn("gradient_average_split_factor has been renamed gradient_predivide_factor (as "
                  "in Apex); it still works here, but use gradient_predivide_factor",
                  FutureWarning, stacklevel=3)
    return split_factor
