"""Multi-tensor ops (plain functions) and Apex's applier convention."""

from .applier import MultiTensorApply, multi_tensor_applier
from . import ops
from .ops import *  # noqa: F401,F403  (the ops, ops.__all__)

OPS = tuple(ops.__all__)
__all__ = ["MultiTensorApply", "amp_C", "multi_tensor_applier", *OPS]


def __getattr__(name):
    # Apex's amp_C lives with Apex's other extension stand-ins; it stays importable from
    # here (``from core_ops.multi_tensor_apply import multi_tensor_applier, amp_C``, the
    # migration guide's spelling), loaded on first use.
    if name == "amp_C":
        from ..compat.apex_extensions import amp_C
        return amp_C
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
