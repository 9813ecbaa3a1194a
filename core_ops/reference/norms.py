"""Layer norm and RMS norm on rows, forward and backward, in the accumulation dtype
(float32; float64 for float64 input), written with plain torch ops: the math of
Apex's ``fused_layer_norm_cuda`` entry points (statistics returned per row, backward
from the input or, ``memory_efficient``, from the output).

Every function takes 2-D (rows, hidden) tensors. ``rstd`` is 1 / sqrt(var + eps) (Apex
calls it ``invvar``); ``xhat`` is the normalized row before weight and bias.
"""

from __future__ import annotations

import torch

from .._validate import check_norm_args, check_norm_bwd_args, check_residual


def acc_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def layer_norm_forward(x, weight, bias, eps):
    """``(y, mean, rstd)``: ``y = (x - mean) * rstd * weight + bias`` in the
    accumulation dtype, the statistics per row."""
    acc = acc_dtype(x.dtype)
    xf = x.to(acc)
    mean = xf.mean(-1)
    centered = xf - mean[:, None]
    rstd = torch.rsqrt(centered.square().mean(-1) + eps)
    y = centered * rstd[:, None]
    if weight is not None:
        y = y * weight.to(acc)
    if bias is not None:
        y = y + bias.to(acc)
    return y, mean, rstd


def rms_norm_forward(x, weight, eps):
    """``(y, rstd)``: ``y = x * rstd * weight``, ``rstd = 1 / sqrt(mean(x^2) + eps)``."""
    acc = acc_dtype(x.dtype)
    xf = x.to(acc)
    rstd = torch.rsqrt(xf.square().mean(-1) + eps)
    y = xf * rstd[:, None]
    return (y if weight is None else y * weight.to(acc)), rstd


def _xhat_from_output(y, weight, bias, acc):
    # memory_efficient: the forward kept its output, not its input; invert the affine
    # map (Apex's choice too: a weight element of 0 loses that column's xhat).
    xhat = y.to(acc)
    if bias is not None:
        xhat = xhat - bias.to(acc)
    if weight is not None:
        xhat = xhat / weight.to(acc)
    return xhat


def layer_norm_backward(dy, mean, rstd, x_or_y, weight, bias, memory_efficient=False):
    """``(dx, dweight, dbias)`` (the last two None without weight / bias), in the
    accumulation dtype; ``x_or_y`` is the forward's input, or its output when
    ``memory_efficient``."""
    acc = acc_dtype(x_or_y.dtype)
    rstd = rstd.to(acc)[:, None]
    if memory_efficient:
        xhat = _xhat_from_output(x_or_y, weight, bias, acc)
    else:
        xhat = (x_or_y.to(acc) - mean.to(acc)[:, None]) * rstd
    dyf = dy.to(acc)
    g = dyf if weight is None else dyf * weight.to(acc)
    dx = rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
    dweight = None if weight is None else (dyf * xhat).sum(0)
    dbias = None if bias is None else dyf.sum(0)
    return dx, dweight, dbias


def rms_norm_backward(dy, rstd, x_or_y, weight, memory_efficient=False):
    """``(dx, dweight)`` (dweight None without weight), as ``layer_norm_backward``."""
    acc = acc_dtype(x_or_y.dtype)
    rstd = rstd.to(acc)[:, None]
    xhat = _xhat_from_output(x_or_y, weight, None, acc) if memory_efficient else x_or_y.to(acc) * rstd
    dyf = dy.to(acc)
    g = dyf if weight is None else dyf * weight.to(acc)
    dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
    return dx, (None if weight is None else (dyf * xhat).sum(0))


# ---- the ops (Note [Norm ops] in _schemas.py) ------------------------------------------

def _flat(p):
    return None if p is None else p.reshape(-1)


def _param_grad(g, p, like):
    return like.new_empty((0,)) if p is None else g.to(p.dtype).reshape(p.shape)


def layer_norm_fwd(input, weight, bias, hidden, eps, out_dtype, memory_efficient=False):
    check_norm_args(input, hidden, (("weight", weight), ("bias", bias)), out_dtype)
    y, mean, rstd = layer_norm_forward(input.reshape(-1, hidden), _flat(weight), _flat(bias), eps)
    return y.to(out_dtype or input.dtype).reshape(input.shape), mean, rstd


def rms_norm_fwd(input, weight, hidden, eps, out_dtype, memory_efficient=False):
    check_norm_args(input, hidden, (("weight", weight),), out_dtype)
    y, rstd = rms_norm_forward(input.reshape(-1, hidden), _flat(weight), eps)
    return y.to(out_dtype or input.dtype).reshape(input.shape), rstd


def layer_norm_bwd(grad_out, saved, mean, rstd, weight, bias, hidden, memory_efficient, dx_dtype):
    check_norm_args(saved, hidden, (("weight", weight), ("bias", bias)), name="saved")
    check_norm_bwd_args(grad_out, saved, (("mean", mean), ("rstd", rstd)), hidden, dx_dtype, memory_efficient)
    rows = saved.reshape(-1, hidden)
    dx, dw, db = layer_norm_backward(grad_out.reshape(rows.shape), mean, rstd, rows, _flat(weight), _flat(bias),
                                     memory_efficient)
    return (dx.to(dx_dtype).reshape(saved.shape), _param_grad(dw, weight, saved), _param_grad(db, bias, saved))


def rms_norm_bwd(grad_out, saved, rstd, weight, hidden, memory_efficient, dx_dtype):
    check_norm_args(saved, hidden, (("weight", weight),), name="saved")
    check_norm_bwd_args(grad_out, saved, (("rstd", rstd),), hidden, dx_dtype, memory_efficient)
    rows = saved.reshape(-1, hidden)
    dx, dw = rms_norm_backward(grad_out.reshape(rows.shape), rstd, rows, _flat(weight), memory_efficient)
    return dx.to(dx_dtype).reshape(saved.shape), _param_grad(dw, weight, saved)


def fused_add_rms_norm_fwd(input, residual, weight, hidden, eps, memory_efficient=False):
    check_norm_args(input, hidden, (("weight", weight),))  # in the kernels' order: input, weight, residual
    check_residual(input, residual)
    h = input + residual
    y, rstd = rms_norm_fwd(h, weight, hidden, eps, None)
    return y, h, rstd


KERNELS = {"layer_norm_fwd": layer_norm_fwd, "layer_norm_bwd": layer_norm_bwd,
           "rms_norm_fwd": rms_norm_fwd, "rms_norm_bwd": rms_norm_bwd,
           "fused_add_rms_norm_fwd": fused_add_rms_norm_fwd}
