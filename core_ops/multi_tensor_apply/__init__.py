"""Multi-tensor ops (plain functions) and Apex's applier convention."""

from .applier import MultiTensorApply, multi_tensor_applier
from .ops import (
    clip_grad_norm_,
    multi_tensor_axpby,
    multi_tensor_check_finite,
    multi_tensor_l2norm,
    multi_tensor_scale,
    multi_tensor_unscale_l2norm,
    update_scale,
)

__all__ = [
    "MultiTensorApply", "amp_C", "clip_grad_norm_", "multi_tensor_applier", "multi_tensor_axpby",
    "multi_tensor_check_finite", "multi_tensor_l2norm", "multi_tensor_scale",
    "multi_tensor_unscale_l2norm", "update_scale",
]


def __getattr__(name):
    # Apex's amp_C lives with Apex's other extension stand-ins; it stays importable from
    # here (``from core_ops.multi_tensor_apply import multi_tensor_applier, amp_C``, the
    # migration guide's spelling), loaded on first use.
    if name == "amp_C":
        from ..compat.apex_extensions import amp_C
        return amp_C
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
