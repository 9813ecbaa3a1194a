"""Apex's normalization modules (``apex.normalization``) on torch's own fused
``layer_norm`` / ``rms_norm`` kernels, which are as fast as Apex's on CPU and CUDA.
Their state dicts are those of ``nn.LayerNorm`` / ``nn.RMSNorm``."""

import torch
import torch.nn.functional as F
from torch import nn


def _accumulation_dtype(x, weight):
    dtype = torch.promote_types(x.dtype, torch.float32)
    return dtype if weight is None else torch.promote_types(dtype, weight.dtype)


def _to(t, dtype):
    return None if t is None else t.to(dtype)


class FusedLayerNorm(nn.LayerNorm):
    """``apex.normalization.FusedLayerNorm``: ``nn.LayerNorm`` with Apex's arguments
    (``memory_efficient`` is accepted; torch's kernel already saves only the stats)."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, memory_efficient=False):
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine)


class FusedRMSNorm(nn.RMSNorm):
    """``apex.normalization.FusedRMSNorm``: ``y = x / sqrt(mean(x^2) + eps) * weight``."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, memory_efficient=False):
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine)


class MixedFusedLayerNorm(FusedLayerNorm):
    """Float32 weights applied to half inputs, statistics in float32, output in the
    input's dtype (Apex's "mixed" variant, used with O2-style half models)."""

    def forward(self, x):
        acc = _accumulation_dtype(x, self.weight)
        y = F.layer_norm(x.to(acc), self.normalized_shape, _to(self.weight, acc), _to(self.bias, acc),
                         self.eps)
        return y.to(x.dtype)


class MixedFusedRMSNorm(FusedRMSNorm):
    """Float32 weight, half input, float32 statistics, output in the input's dtype."""

    def forward(self, x):
        acc = _accumulation_dtype(x, self.weight)
        return F.rms_norm(x.to(acc), self.normalized_shape, _to(self.weight, acc), self.eps).to(x.dtype)


__all__ = ["FusedLayerNorm", "FusedRMSNorm", "MixedFusedLayerNorm", "MixedFusedRMSNorm"]
