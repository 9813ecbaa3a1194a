"""Apex's ``contrib.clip_grad.clip_grad_norm_``: torch's signature, the L2 norm in one
multi-tensor pass per (device, dtype), on any device."""

from ..._clip import clip_grad_norm_

__all__ = ["clip_grad_norm_"]
