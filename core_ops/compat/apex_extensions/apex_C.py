"""Apex's ``apex_C`` extension: the flatten / unflatten helpers of its old DDP code."""

from torch._utils import _flatten_dense_tensors as flatten  # noqa: F401  (apex_C's names)
from torch._utils import _unflatten_dense_tensors as unflatten  # noqa: F401
