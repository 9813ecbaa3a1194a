"""Apex's functional forms and autograd functions of its fused norms
(``apex.normalization.fused_layer_norm.FusedLayerNormAffineFunction`` and kin), which
Megatron-LM, NeMo and DeepSpeed import directly. They run torch's own fused
``layer_norm`` / ``rms_norm`` (torch's autograd gives the backward) in float32 or
wider, whatever the input and weight dtypes, and return the input's dtype; Apex's
"mixed dtypes" forms (float32 weights with half inputs) return the weight's dtype. ``memory_efficient`` is
accepted: torch's kernels save only the statistics anyway.

Note [Norms under autocast]: as Apex's (``apex/_autocast_utils.py``), under
``torch.autocast`` for the input's device every floating argument is cast to the
autocast dtype and the norm runs with autocast off, so the output is in that dtype
(statistics still float32), which Megatron and NeMo expect; torch's own ``layer_norm``
is on autocast's float32 list and would return float32."""

import functools

import torch
import torch.nn.functional as F


def _shape(normalized_shape):
    return (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)


def _accumulation_dtype(x, weight):
    dtype = torch.promote_types(x.dtype, torch.float32)
    return dtype if weight is None else torch.promote_types(dtype, weight.dtype)


def _to(t, dtype):
    return None if t is None else t.to(dtype)


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


@in_autocast_dtype
def fused_layer_norm_affine(input, weight, bias, normalized_shape, eps=1e-6, memory_efficient=False):
    acc = _accumulation_dtype(input, weight)
    return F.layer_norm(input.to(acc), _shape(normalized_shape), _to(weight, acc), _to(bias, acc),
                        eps).to(input.dtype)


@in_autocast_dtype
def fused_layer_norm(input, normalized_shape, eps=1e-6, memory_efficient=False):
    return fused_layer_norm_affine(input, None, None, normalized_shape, eps)


@in_autocast_dtype
def fused_rms_norm_affine(input, weight, normalized_shape, eps=1e-6, memory_efficient=False):
    acc = _accumulation_dtype(input, weight)
    return F.rms_norm(input.to(acc), _shape(normalized_shape), _to(weight, acc), eps).to(input.dtype)


@in_autocast_dtype
def fused_rms_norm(input, normalized_shape, eps=1e-6, memory_efficient=False):
    return fused_rms_norm_affine(input, None, normalized_shape, eps)


@in_autocast_dtype
def mixed_dtype_fused_layer_norm_affine(input, weight, bias, normalized_shape, eps=1e-6,
                                        memory_efficient=False):
    """As ``fused_layer_norm_affine``, the output in the weight's dtype (Apex's)."""
    acc = _accumulation_dtype(input, weight)
    return F.layer_norm(input.to(acc), _shape(normalized_shape), _to(weight, acc), _to(bias, acc),
                        eps).to(weight.dtype)


@in_autocast_dtype
def mixed_dtype_fused_rms_norm_affine(input, weight, normalized_shape, eps=1e-6,
                                      memory_efficient=False):
    """As ``fused_rms_norm_affine``, the output in the weight's dtype (Apex's)."""
    acc = _accumulation_dtype(input, weight)
    return F.rms_norm(input.to(acc), _shape(normalized_shape), _to(weight, acc), eps).to(weight.dtype)


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
