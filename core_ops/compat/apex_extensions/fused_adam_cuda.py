"""Apex's ``fused_adam_cuda`` (the contrib extension that fairseq's and Apex's old
``FusedAdam`` call directly): one Adam step on one tensor or on lists, with the grad
divided by ``grad_scale`` and an optional reduced-precision copy of the new params.

Its Adam is not torch's: with ``bias_correction`` the step size is
``lr * sqrt(1 - beta2^step) / (1 - beta1^step)`` applied to ``m / (sqrt(v) + eps)``
(``mode`` 1; ``mode`` 0 puts eps under the root), and ``decay * p`` is added to the
update (decoupled from the moments, scaled by the step size). The math runs in float32
(float64 for float64 params), as Apex's kernel did for its float32 params.
"""

from __future__ import annotations

import math

import torch

_EPS_UNDER_ROOT = 0


def _check(name, t, like, dtype=None):
    if t.shape != like.shape or t.device != like.device:
        raise ValueError(f"fused_adam_cuda: {name} has shape {list(t.shape)} on {t.device}; expected "
                         f"the param's {list(like.shape)} on {like.device}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"fused_adam_cuda: {name} is {t.dtype}; expected {dtype}, the param's dtype")


def _step_size(lr, beta1, beta2, step, bias_correction):
    if not bias_correction:
        return lr
    return lr * math.sqrt(1.0 - beta2**step) / (1.0 - beta1**step)


@torch.no_grad()
def adam(p, p_copy, m, v, g, lr, beta1, beta2, eps, grad_scale, step, mode, bias_correction, decay):
    """One step on ``p`` (float32), its moments ``m`` and ``v`` (p's dtype) from the grad
    ``g`` (p's dtype or half) divided by ``grad_scale``; ``p_copy``, unless empty,
    receives the new ``p`` in its own dtype."""
    if not p.is_floating_point() or p.dtype in (torch.float16, torch.bfloat16):
        raise TypeError(f"fused_adam_cuda.adam: p must be float32 or float64 (the master params), got {p.dtype}")
    _check("m", m, p, p.dtype)
    _check("v", v, p, p.dtype)
    _check("g", g, p)
    if p_copy.numel():
        _check("p_copy", p_copy, p)
    grad = g.to(p.dtype) / grad_scale
    m.mul_(beta1).add_(grad, alpha=1.0 - beta1)
    v.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
    denom = (v + eps).sqrt_() if mode == _EPS_UNDER_ROOT else v.sqrt().add_(eps)
    update = (m / denom).add_(p, alpha=decay)
    p.sub_(update, alpha=_step_size(lr, beta1, beta2, step, bias_correction))
    if p_copy.numel():
        p_copy.copy_(p)


def adam_mt(chunk_size, overflow_flag, tensor_lists, lr, beta1, beta2, eps, grad_scale, step, mode,
            bias_correction, decay):
    """``adam`` over lists ``[p, m, v, g]`` or ``[p, m, v, g, p_copy]`` (the
    multi-tensor form; ``chunk_size`` and ``overflow_flag`` are accepted and unused, as
    in Apex, whose kernel did not check the grads)."""
    if len(tensor_lists) not in (4, 5) or len({len(t) for t in tensor_lists}) != 1:
        raise ValueError("fused_adam_cuda.adam_mt: tensor_lists must be 4 or 5 lists of one length "
                         f"([p, m, v, g] or [p, m, v, g, p_copy]), got lengths {[len(t) for t in tensor_lists]}")
    p, m, v, g = tensor_lists[:4]
    copies = tensor_lists[4] if len(tensor_lists) == 5 else [p_.new_empty(0) for p_ in p]
    for args in zip(p, copies, m, v, g):
        adam(*args, lr, beta1, beta2, eps, grad_scale, step, mode, bias_correction, decay)


@torch.no_grad()
def strided_check_finite(overflow_flag, p_copy, stride, clear_overflow_first):
    """Sets ``overflow_flag`` to 1 if ``p_copy[::stride]`` holds an inf or nan (cleared
    first if ``clear_overflow_first``)."""
    if clear_overflow_first:
        overflow_flag.zero_()
    bad = ~torch.isfinite(p_copy.reshape(-1)[::max(int(stride), 1)]).all()
    overflow_flag.copy_(torch.maximum(overflow_flag, bad.to(overflow_flag.dtype)))


@torch.no_grad()
def maybe_cast(overflow_flag, p_in, p_out):
    """``p_out = p_in`` (cast to p_out's dtype) unless ``overflow_flag`` is set."""
    keep = overflow_flag.reshape(-1)[0].to(torch.bool)
    p_out.copy_(torch.where(keep, p_out, p_in.to(p_out.dtype)))


def maybe_cast_mt(chunk_size, overflow_flag, tensor_lists):
    """``maybe_cast`` over ``[p_in list, p_out list]``."""
    for p_in, p_out in zip(*tensor_lists, strict=True):
        maybe_cast(overflow_flag, p_in, p_out)


def __getattr__(name):
    raise AttributeError(f"core_ops' fused_adam_cuda stand-in has no {name!r}: it provides adam, adam_mt, "
                         f"strided_check_finite, maybe_cast and maybe_cast_mt (Apex's reversible_adam and "
                         f"maybe_adam_undo are not provided)")
