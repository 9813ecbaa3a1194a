"""Apex's ``fused_layer_norm_cuda``: layer norm and RMS norm entry points returning
their per-row statistics, and backward from them (Megatron-LM and NeMo call these
directly), on core_ops' norm ops (Note [Norm ops] in _schemas.py): float32 math for
half inputs, the statistics flat (one per row) in float32 (float64 for float64 input),
as Apex's. ``memory_efficient`` backward takes the forward's output instead of its
input."""

from __future__ import annotations

from ... import native
from ..._schemas import op
from ._args import rows


def _run(name, input, *args):
    native.ensure_for(input.device)
    return op(name)(input, *args)


def _forward_ln(fn, input, normalized_shape, gamma, beta, eps, out_dtype=None):
    _, hidden = rows(fn, input, normalized_shape, ("gamma", gamma), ("beta", beta))
    return list(_run("layer_norm_fwd", input, gamma, beta, hidden, eps, out_dtype))


def forward(input, normalized_shape, eps):
    return _forward_ln("forward", input, normalized_shape, None, None, eps)


def forward_affine(input, normalized_shape, gamma, beta, eps):
    return _forward_ln("forward_affine", input, normalized_shape, gamma, beta, eps)


def forward_affine_mixed_dtypes(input, normalized_shape, gamma, beta, eps):
    """The output in the weight's dtype (float32 weights with half input: Megatron's)."""
    out = None if gamma.dtype == input.dtype else gamma.dtype
    return _forward_ln("forward_affine_mixed_dtypes", input, normalized_shape, gamma, beta, eps, out)


def _backward_ln(fn, dout, mean, invvar, input_or_output, normalized_shape, gamma, beta, memory_efficient):
    _, hidden = rows(fn, input_or_output, normalized_shape, ("gamma", gamma), ("beta", beta))
    if mean is None and not memory_efficient:
        raise ValueError(f"{fn}: mean may be None only with memory_efficient=True")
    dx, dg, db = op("layer_norm_bwd")(dout, input_or_output, invvar if mean is None else mean, invvar, gamma, beta,
                                      hidden, memory_efficient, input_or_output.dtype)
    return dx, (None if gamma is None else dg), (None if beta is None else db)


def backward(dout, mean, invvar, input_or_output, normalized_shape, eps, memory_efficient=False):
    return _backward_ln("backward", dout, mean, invvar, input_or_output, normalized_shape, None, None,
                        memory_efficient)[0]


def backward_affine(dout, mean, invvar, input_or_output, normalized_shape, gamma, beta, eps,
                    memory_efficient=False):
    return list(_backward_ln("backward_affine", dout, mean, invvar, input_or_output, normalized_shape,
                             gamma, beta, memory_efficient))


def _forward_rms(fn, input, normalized_shape, gamma, eps, out_dtype=None):
    _, hidden = rows(fn, input, normalized_shape, ("gamma", gamma))
    return list(_run("rms_norm_fwd", input, gamma, hidden, eps, out_dtype))


def rms_forward(input, normalized_shape, eps):
    return _forward_rms("rms_forward", input, normalized_shape, None, eps)


def rms_forward_affine(input, normalized_shape, gamma, eps):
    return _forward_rms("rms_forward_affine", input, normalized_shape, gamma, eps)


def rms_forward_affine_mixed_dtypes(input, normalized_shape, gamma, eps):
    out = None if gamma.dtype == input.dtype else gamma.dtype
    return _forward_rms("rms_forward_affine_mixed_dtypes", input, normalized_shape, gamma, eps, out)


def _backward_rms(fn, dout, invvar, input_or_output, normalized_shape, gamma, memory_efficient):
    _, hidden = rows(fn, input_or_output, normalized_shape, ("gamma", gamma))
    dx, dg = op("rms_norm_bwd")(dout, input_or_output, invvar, gamma, hidden, memory_efficient,
                                input_or_output.dtype)
    return dx, (None if gamma is None else dg)


def rms_backward(dout, invvar, input_or_output, normalized_shape, eps, memory_efficient=False):
    return _backward_rms("rms_backward", dout, invvar, input_or_output, normalized_shape, None, memory_efficient)[0]


def rms_backward_affine(dout, invvar, input_or_output, normalized_shape, gamma, eps, memory_efficient=False):
    return list(_backward_rms("rms_backward_affine", dout, invvar, input_or_output, normalized_shape, gamma,
                              memory_efficient))

def __getattr__(name):
    raise AttributeError(f"core_ops' fused_layer_norm_cuda stand-in has no {name!r}: it provides forward, "
                         f"forward_affine, forward_affine_mixed_dtypes, backward, backward_affine and their "
                         f"rms_ forms")
