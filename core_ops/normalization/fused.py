"""core_ops' own layer norm and RMS norm (Note [Norm ops] in _library.py), with their
autograd registered on the ops, so they work in eager mode and under torch.compile:

    y = layer_norm(x, (4096,), weight, bias, eps=1e-5, memory_efficient=False, out_dtype=None)
    y = rms_norm(x, (4096,), weight, eps=1e-5)
    y, h = fused_add_rms_norm(x, residual, weight, eps=1e-5)   # h = x + residual, y = rms_norm(h)

Statistics are float32 (float64 for float64 input) whatever the input dtype;
``out_dtype=torch.float32`` with half input gives Apex's "mixed" output.
``memory_efficient=True`` keeps the output instead of the input for backward (Apex's).
"""

from __future__ import annotations

import math

import torch

from .. import _build
from .._library import op
from .._validate import check_norm_args, check_residual
from ..torch_patches import inductor_norms

inductor_norms.install_when_imported()  # Note [Norms under inductor]


def _hidden(input, normalized_shape):
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not shape or tuple(input.shape[input.dim() - len(shape):]) != shape:
        raise ValueError(f"normalized_shape {list(shape)} must be the trailing dims of the input, whose shape "
                         f"is {list(input.shape)}")
    return math.prod(shape)


# Note [Norm checks before dispatch]: each public entry point checks its arguments in
# Python before the op is called, the C++ autograd checks them again before it builds
# a node (norm_autograd.h), and each kernel checks them once more. A bad input then
# raises the same error on every device and never reaches device code or the
# autograd machinery; on the H200 one reached the CUDA path and the process died.

def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5, memory_efficient=False, out_dtype=None):
    hidden = _hidden(input, normalized_shape)
    check_norm_args(input, hidden, (("weight", weight), ("bias", bias)), out_dtype)
    _build.ensure_for(input.device)
    return op("layer_norm_fwd")(input, weight, bias, hidden, float(eps), out_dtype, bool(memory_efficient))[0]


def _rms_eps(input, eps):
    # None as in nn.RMSNorm / F.rms_norm: the machine epsilon of the input's dtype.
    return torch.finfo(input.dtype).eps if eps is None and input.is_floating_point() else eps


def rms_norm(input, normalized_shape, weight=None, eps=1e-5, memory_efficient=False, out_dtype=None):
    """``eps=None`` is the input dtype's machine epsilon, as ``F.rms_norm``'s."""
    eps = _rms_eps(input, eps)
    hidden = _hidden(input, normalized_shape)
    check_norm_args(input, hidden, (("weight", weight),), out_dtype)
    _build.ensure_for(input.device)
    return op("rms_norm_fwd")(input, weight, hidden, float(eps), out_dtype, bool(memory_efficient))[0]


def fused_add_rms_norm(input, residual, weight, eps=1e-5, memory_efficient=False):
    """``(rms_norm(input + residual) * weight, input + residual)``: the pre-norm residual
    step of Llama-style blocks, in one pass over input and residual (the sum is
    normalized while it is in cache). The norm is over weight's shape (the last dim
    without a weight); ``eps=None`` as in ``rms_norm``."""
    eps = _rms_eps(input, eps)
    shape = input.shape[-1:] if weight is None else tuple(weight.shape)
    hidden = _hidden(input, shape)
    check_norm_args(input, hidden, (("weight", weight),))
    check_residual(input, residual)
    _build.ensure_for(input.device)
    y, h, _ = op("fused_add_rms_norm_fwd")(input, residual, weight, hidden, float(eps), bool(memory_efficient))
    return y, h


# ---- autograd ----------------------------------------------------------------------------

def _ln_setup(ctx, inputs, output):
    input, weight, bias, hidden, eps, out_dtype, memory_efficient = inputs
    out, mean, rstd = output
    ctx.hidden, ctx.memory_efficient, ctx.dx_dtype = hidden, memory_efficient, input.dtype
    ctx.save_for_backward(out if memory_efficient else input, mean, rstd, weight, bias)


def _ln_backward(ctx, grad_out, grad_mean, grad_rstd):
    saved, mean, rstd, weight, bias = ctx.saved_tensors
    dx, dw, db = op("layer_norm_bwd")(grad_out, saved, mean, rstd, weight, bias, ctx.hidden,
                                      ctx.memory_efficient, ctx.dx_dtype)
    return (dx, dw if weight is not None else None, db if bias is not None else None, None, None, None, None)


def _rms_setup(ctx, inputs, output):
    input, weight, hidden, eps, out_dtype, memory_efficient = inputs
    out, rstd = output
    ctx.hidden, ctx.memory_efficient, ctx.dx_dtype = hidden, memory_efficient, input.dtype
    ctx.save_for_backward(out if memory_efficient else input, rstd, weight)


def _rms_backward(ctx, grad_out, grad_rstd):
    saved, rstd, weight = ctx.saved_tensors
    dx, dw = op("rms_norm_bwd")(grad_out, saved, rstd, weight, ctx.hidden, ctx.memory_efficient, ctx.dx_dtype)
    return dx, (dw if weight is not None else None), None, None, None, None


def _add_rms_setup(ctx, inputs, output):
    input, residual, weight, hidden, eps, memory_efficient = inputs
    y, h, rstd = output
    ctx.hidden, ctx.memory_efficient, ctx.dx_dtype = hidden, memory_efficient, input.dtype
    ctx.save_for_backward(y if memory_efficient else h, rstd, weight)


def _add_rms_backward(ctx, grad_y, grad_h, grad_rstd):
    saved, rstd, weight = ctx.saved_tensors
    if grad_y is None:
        grad_y = torch.zeros_like(saved)
    dh, dw = op("rms_norm_bwd")(grad_y, saved, rstd, weight, ctx.hidden, ctx.memory_efficient, ctx.dx_dtype)
    if grad_h is not None:
        dh = dh + grad_h  # h is also an output: its own grad joins the norm's
    return dh, dh, (dw if weight is not None else None), None, None, None


torch.library.register_autograd("core_ops::layer_norm_fwd", _ln_backward, setup_context=_ln_setup)
torch.library.register_autograd("core_ops::fused_add_rms_norm_fwd", _add_rms_backward,
                                setup_context=_add_rms_setup)
torch.library.register_autograd("core_ops::rms_norm_fwd", _rms_backward, setup_context=_rms_setup)
