"""``torch.nn.utils.clip_grad_norm_`` with its signature, the L2 case on core_ops'
multi-tensor norm (one pass per device and dtype, no host sync unless asked to check):
Apex's ``contrib.clip_grad.clip_grad_norm_`` and ``fp16_utils.clip_grad_norm``."""

from __future__ import annotations

import math

import torch

from ... import multi_tensor_apply


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """Scales the grads of ``parameters`` (a tensor or an iterable of them) in place so
    that their global ``norm_type`` norm is at most ``max_norm``; returns that norm
    before clipping. Other norms than L2 are torch's."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    params = [p for p in parameters if p.grad is not None]
    if float(norm_type) != 2.0 or any(p.grad.is_sparse for p in params):
        return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type,
                                              error_if_nonfinite=error_if_nonfinite, foreach=foreach)
    if not params:
        return torch.tensor(0.0)
    max_norm = float(max_norm)
    grads = [p.grad for p in params]
    if error_if_nonfinite:  # checked before anything is scaled, as torch does
        groups = {}
        for g in grads:
            groups.setdefault((g.device, g.dtype), []).append(g)
        total = torch.stack([multi_tensor_apply.multi_tensor_l2norm(gs)[0].cpu() for gs in groups.values()]).norm()
        if not math.isfinite(float(total)):
            raise RuntimeError(f"The total norm of order 2.0 for gradients from `parameters` is "
                               f"non-finite ({float(total)}), so it cannot be clipped; pass "
                               f"error_if_nonfinite=False to scale them by it anyway")
    return multi_tensor_apply.clip_grad_norm_(grads, max_norm)
