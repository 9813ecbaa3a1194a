"""Apex's ``fused_layer_norm_cuda``: layer norm and RMS norm entry points returning
their per-row statistics, and backward from them (Megatron-LM and NeMo call these
directly). The math is ``core_ops.reference.norms``, in float32 for half inputs; the
statistics come back flat (one per row) in float32 (float64 for float64 input), as
Apex's did. ``memory_efficient`` backward takes the forward's output instead of its
input."""

from __future__ import annotations

from ....reference import norms
from ._args import rows


def _forward_ln(fn, input, normalized_shape, gamma, beta, eps, out_dtype=None):
    x, _ = rows(fn, input, normalized_shape, ("gamma", gamma), ("beta", beta))
    y, mean, rstd = norms.layer_norm_forward(x, gamma, beta, eps)
    return [y.to(out_dtype or input.dtype).reshape(input.shape), mean, rstd]


def forward(input, normalized_shape, eps):
    return _forward_ln("forward", input, normalized_shape, None, None, eps)


def forward_affine(input, normalized_shape, gamma, beta, eps):
    return _forward_ln("forward_affine", input, normalized_shape, gamma, beta, eps)


def forward_affine_mixed_dtypes(input, normalized_shape, gamma, beta, eps):
    """The output in the weight's dtype (float32 weights with half input: Megatron's)."""
    return _forward_ln("forward_affine_mixed_dtypes", input, normalized_shape, gamma, beta, eps, gamma.dtype)


def _backward_ln(fn, dout, mean, invvar, input_or_output, normalized_shape, gamma, beta, memory_efficient):
    x, _ = rows(fn, input_or_output, normalized_shape, ("gamma", gamma), ("beta", beta))
    if mean is None and not memory_efficient:
        raise ValueError(f"{fn}: mean may be None only with memory_efficient=True")
    dx, dg, db = norms.layer_norm_backward(dout.reshape(x.shape), mean, invvar, x, gamma, beta,
                                           memory_efficient)
    dx = dx.to(input_or_output.dtype).reshape(input_or_output.shape)
    return dx, (None if gamma is None else dg.to(gamma.dtype)), (None if beta is None else db.to(beta.dtype))


def backward(dout, mean, invvar, input_or_output, normalized_shape, eps, memory_efficient=False):
    return _backward_ln("backward", dout, mean, invvar, input_or_output, normalized_shape, None, None,
                        memory_efficient)[0]


def backward_affine(dout, mean, invvar, input_or_output, normalized_shape, gamma, beta, eps,
                    memory_efficient=False):
    return list(_backward_ln("backward_affine", dout, mean, invvar, input_or_output, normalized_shape,
                             gamma, beta, memory_efficient))


def _forward_rms(fn, input, normalized_shape, gamma, eps, out_dtype=None):
    x, _ = rows(fn, input, normalized_shape, ("gamma", gamma))
    y, rstd = norms.rms_norm_forward(x, gamma, eps)
    return [y.to(out_dtype or input.dtype).reshape(input.shape), rstd]


def rms_forward(input, normalized_shape, eps):
    return _forward_rms("rms_forward", input, normalized_shape, None, eps)


def rms_forward_affine(input, normalized_shape, gamma, eps):
    return _forward_rms("rms_forward_affine", input, normalized_shape, gamma, eps)


def rms_forward_affine_mixed_dtypes(input, normalized_shape, gamma, eps):
    return _forward_rms("rms_forward_affine_mixed_dtypes", input, normalized_shape, gamma, eps, gamma.dtype)


def _backward_rms(fn, dout, invvar, input_or_output, normalized_shape, gamma, memory_efficient):
    x, _ = rows(fn, input_or_output, normalized_shape, ("gamma", gamma))
    dx, dg = norms.rms_norm_backward(dout.reshape(x.shape), invvar, x, gamma, memory_efficient)
    return dx.to(input_or_output.dtype).reshape(input_or_output.shape), (None if gamma is None else dg.to(gamma.dtype))


def rms_backward(dout, invvar, input_or_output, normalized_shape, eps, memory_efficient=False):
    return _backward_rms("rms_backward", dout, invvar, input_or_output, normalized_shape, None, memory_efficient)[0]


def rms_backward_affine(dout, invvar, input_or_output, normalized_shape, gamma, eps, memory_efficient=False):
    return list(_backward_rms("rms_backward_affine", dout, invvar, input_or_output, normalized_shape, gamma,
                              memory_efficient))


def __getattr__(name):
    raise AttributeError(f"core_ops' fused_layer_norm_cuda stand-in has no {name!r}: it provides forward, "
                         f"forward_affine, forward_affine_mixed_dtypes, backward, backward_affine and their "
                         f"rms_ forms")
