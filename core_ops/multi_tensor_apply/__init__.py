"""Multi-tensor ops (plain functions) and Apex's applier convention."""

from . import amp_C
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
