"""Fused optimizers with Apex's constructors: ``from apex.optimizers import X``
becomes ``from core_ops.optimizers import X``."""

from .fused_adam import FusedAdam

__all__ = ["FusedAdam"]
