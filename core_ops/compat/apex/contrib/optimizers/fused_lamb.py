"""Apex's ``contrib.optimizers.FusedLAMB``: the same optimizer and arguments as
``apex.optimizers.FusedLAMB`` (core_ops' ``FusedLAMB``); contrib's copy differed only
in how it launched its kernels."""

from .....optimizers import FusedLAMB

__all__ = ["FusedLAMB"]
