"""Apex's functional forms and autograd functions of its fused norms
(``apex.normalization.fused_layer_norm.FusedLayerNormAffineFunction`` and kin), which
Megatron-LM, NeMo and DeepSpeed import directly, on core_ops' norm ops (fused.py):
statistics in float32 (float64 for float64 input) whatever the input and weight dtypes,
output in the input's dtype; Apex's "mixed dtypes" forms (float32 weights with half
inputs) return the weight's dtype. ``memory_efficient=True`` keeps the output instead of
the input for backward, as Apex's did.

Note [Norms under autocast]: as Apex's (``apex/_autocast_utils.py``), under
``torch.autocast`` for the input's device every floating argument is cast to the
autocast dtype and the norm runs with autocast off, so the output is in that dtype
(statistics still float32), which Megatron and NeMo expect; torch's own ``layer_norm``
is on autocast's float32 list and would return float32."""

import functools

import torch

from . import fused


def autocast_dtype(t):
    """The dtype torch.autocast computes in for ``t``'s device, or None outside it."""
    device = t.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None


def in_autocast_dtype(fn):
    """``fn(input, ...)`` as Apex runs it under autocast (Note [Norms under autocast])."""
    @functools.wraps(fn)
    def run(input, *args, **kwargs):
        dtype = autocast_dtype(input)
        if dtype is None:
            return fn(input, *args, **kwargs)
        cast = [a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                for a in (input, *args)]
        with torch.autocast(input.device.type, enabled=False):
            return fn(*cast, **kwargs)
    return run


def _mixed_out(input, weight):
    """The output dtype of Apex's mixed forms: the weight's; None where that is the
    input's (or a dtype the op cannot write directly, cast afterwards)."""
    return None if weight is None or weight.dtype == input.dtype else weight.dtype


@in_autocast_dtype
def fused_layer_norm_affine(input, weight, bias, normalized_shape, eps=1e-6, memory_efficient=False):
    return fused.layer_norm(input, normalized_shape, weight, bias, eps, memory_efficient)


@in_autocast_dtype
def fused_layer_norm(input, normalized_shape, eps=1e-6, memory_efficient=False):
    return fused.layer_norm(input, normalized_shape, None, None, eps, memory_efficient)


@in_autocast_dtype
def fused_rms_norm_affine(input, weight, normalized_shape, eps=1e-6, memory_efficient=False):
    return fused.rms_norm(input, normalized_shape, weight, eps, memory_efficient)


@in_autocast_dtype
def fused_rms_norm(input, normalized_shape, eps=1e-6, memory_efficient=False):
    return fused.rms_norm(input, normalized_shape, None, eps, memory_efficient)


def _in_weight_dtype(norm, input, weight, *args):
    out = _mixed_out(input, weight)
    if out is None or (out == torch.float32 and input.dtype in (torch.float16, torch.bfloat16)):
        return norm(input, *args, out_dtype=out)
    return norm(input, *args).to(out)


@in_autocast_dtype
def mixed_dtype_fused_layer_norm_affine(input, weight, bias, normalized_shape, eps=1e-6,
                                        memory_efficient=False):
    """As ``fused_layer_norm_affine``, the output in the weight's dtype (Apex's)."""
    return _in_weight_dtype(fused.layer_norm, input, weight, normalized_shape, weight, bias, eps, memory_efficient)


@in_autocast_dtype
def mixed_dtype_fused_rms_norm_affine(input, weight, normalized_shape, eps=1e-6,
                                      memory_efficient=False):
    """As ``fused_rms_norm_affine``, the output in the weight's dtype (Apex's)."""
    return _in_weight_dtype(fused.rms_norm, input, weight, normalized_shape, weight, eps, memory_efficient)


def _function(name, fn):
    """Apex's ``torch.autograd.Function`` subclass ``name``, called as ``X.apply(...)``."""
    return type(name, (), {"apply": staticmethod(fn), "__module__": __name__,
                           "__doc__": f"Apex's {name}: ``apply`` is ``{fn.__name__}``."})


FusedLayerNormAffineFunction = _function("FusedLayerNormAffineFunction", fused_layer_norm_affine)
FusedLayerNormAffineMixedDtypesFunction = _function("FusedLayerNormAffineMixedDtypesFunction",
                                                    mixed_dtype_fused_layer_norm_affine)
FusedLayerNormFunction = _function("FusedLayerNormFunction", fused_layer_norm)
FusedRMSNormAffineFunction = _function("FusedRMSNormAffineFunction", fused_rms_norm_affine)
FusedRMSNormAffineMixedDtypesFunction = _function("FusedRMSNormAffineMixedDtypesFunction",
                                                  mixed_dtype_fused_rms_norm_affine)
FusedRMSNormFunction = _function("FusedRMSNormFunction", fused_rms_norm)
