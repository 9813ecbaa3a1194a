"""core_ops' own layer norm and RMS norm (Note [Norm ops] in _schemas.py), with their
autograd registered on the ops (Note [Norm autograd]), so they work in eager mode and
under torch.compile:

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

from .. import native
from .._schemas import op
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
# Python before the op is called, and each kernel checks them once more (the fake
# kernels under torch.compile). A bad input then raises the same error on every device
# and never reaches device code or the autograd machinery; on the H200 one reached
# the CUDA path and the process died.

def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5, memory_efficient=False, out_dtype=None):
    hidden = _hidden(input, normalized_shape)
    check_norm_args(input, hidden, (("weight", weight), ("bias", bias)), out_dtype)
    native.ensure_for(input.device)
    return op("layer_norm_fwd")(input, weight, bias, hidden, float(eps), out_dtype, bool(memory_efficient))[0]


def _rms_eps(input, eps):
    # None as in nn.RMSNorm / F.rms_norm: the machine epsilon of the input's dtype.
    return torch.finfo(input.dtype).eps if eps is None and input.is_floating_point() else eps


def rms_norm(input, normalized_shape, weight=None, eps=1e-5, memory_efficient=False, out_dtype=None):
    """``eps=None`` is the input dtype's machine epsilon, as ``F.rms_norm``'s."""
    eps = _rms_eps(input, eps)
    hidden = _hidden(input, normalized_shape)
    check_norm_args(input, hidden, (("weight", weight),), out_dtype)
    native.ensure_for(input.device)
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
    native.ensure_for(input.device)
    y, h, _ = op("fused_add_rms_norm_fwd")(input, residual, weight, hidden, float(eps), bool(memory_efficient))
    return y, h
