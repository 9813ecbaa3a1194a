"""Apex's ``apex._autocast_utils`` (NeMo and Megatron import it): the helpers Apex's
fused modules use to run in the autocast dtype. On any device: a tensor is cast when
autocast is on for its device type, to that device's autocast dtype."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from ...normalization.functional import autocast_dtype

__all__ = ["_cast_if_autocast_enabled"]


def _get_autocast_dtypes() -> Sequence[torch.dtype]:
    """The half dtypes autocast can use here: float16, and bfloat16 where supported."""
    if torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
        return [torch.half]
    return [torch.half, torch.bfloat16]


def _get_current_dtype(dtype: Optional[torch.dtype] = None) -> torch.dtype:
    """The autocast dtype if autocast is on (CUDA's, else CPU's), else float32."""
    for device in ("cuda", "cpu"):
        if torch.is_autocast_enabled(device):
            return torch.get_autocast_dtype(device)
    return torch.float


def _cast_if_autocast_enabled(*args):
    """``args`` with each floating-point tensor cast to its device's autocast dtype
    where autocast is on (lists, tuples and dicts are walked); ``args`` as given
    otherwise."""
    def cast(value):
        if isinstance(value, torch.Tensor):
            dtype = autocast_dtype(value) if value.is_floating_point() else None
            return value if dtype is None else value.to(dtype)
        if isinstance(value, (list, tuple)):
            return type(value)(cast(v) for v in value)
        if isinstance(value, dict):
            return {k: cast(v) for k, v in value.items()}
        return value

    return tuple(cast(a) for a in args)
