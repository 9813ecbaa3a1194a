"""Apex's normalization modules (``apex.normalization``) on core_ops' fused norm ops
(fused.py: native kernels on CPU and CUDA, a pure-PyTorch reference elsewhere). Their
state dicts are those of ``nn.LayerNorm`` / ``nn.RMSNorm``."""

from torch import nn

from .fused import fused_add_rms_norm, layer_norm, rms_norm
from .functional import (  # and Apex's other fused_layer_norm names
    FusedLayerNormAffineFunction, FusedLayerNormAffineMixedDtypesFunction, FusedLayerNormFunction,
    FusedRMSNormAffineFunction, FusedRMSNormAffineMixedDtypesFunction, FusedRMSNormFunction,
    autocast_dtype, fused_layer_norm, fused_layer_norm_affine, fused_rms_norm, fused_rms_norm_affine,
    mixed_dtype_fused_layer_norm_affine, mixed_dtype_fused_rms_norm_affine)


class FusedLayerNorm(nn.LayerNorm):
    """``apex.normalization.FusedLayerNorm``: ``nn.LayerNorm`` with Apex's arguments;
    ``memory_efficient=True`` keeps the output, not the input, for backward. Under
    autocast the output is in the autocast dtype (Note [Norms under autocast])."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, memory_efficient=False):
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine)
        self.memory_efficient = memory_efficient

    def forward(self, input):
        return fused_layer_norm_affine(input, self.weight, self.bias, self.normalized_shape, self.eps,
                                       self.memory_efficient)


class FusedRMSNorm(nn.RMSNorm):
    """``apex.normalization.FusedRMSNorm``: ``y = x / sqrt(mean(x^2) + eps) * weight``;
    ``memory_efficient`` as FusedLayerNorm's. Under autocast the output is in the
    autocast dtype (Note [Norms under autocast])."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, memory_efficient=False):
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine)
        self.memory_efficient = memory_efficient

    def forward(self, input):
        return fused_rms_norm_affine(input, self.weight, self.normalized_shape, self.eps, self.memory_efficient)


class MixedFusedLayerNorm(FusedLayerNorm):
    """Float32 weights applied to half inputs, statistics in float32, output in the
    weights' dtype (Apex's "mixed" variant, used with O2-style half models)."""

    def forward(self, x):
        if self.weight is None:
            return fused_layer_norm_affine(x, None, None, self.normalized_shape, self.eps, self.memory_efficient)
        return mixed_dtype_fused_layer_norm_affine(x, self.weight, self.bias, self.normalized_shape,
                                                   self.eps, self.memory_efficient)


class MixedFusedRMSNorm(FusedRMSNorm):
    """Float32 weight, half input, float32 statistics, output in the weight's dtype."""

    def forward(self, x):
        if self.weight is None:
            return fused_rms_norm_affine(x, None, self.normalized_shape, self.eps, self.memory_efficient)
        return mixed_dtype_fused_rms_norm_affine(x, self.weight, self.normalized_shape, self.eps,
                                                 self.memory_efficient)


__all__ = ["fused_add_rms_norm", "layer_norm", "rms_norm", "FusedLayerNorm", "FusedLayerNormAffineFunction", "FusedLayerNormAffineMixedDtypesFunction",
           "FusedLayerNormFunction", "FusedRMSNorm", "FusedRMSNormAffineFunction",
           "FusedRMSNormAffineMixedDtypesFunction", "FusedRMSNormFunction", "MixedFusedLayerNorm",
           "MixedFusedRMSNorm", "fused_layer_norm", "fused_layer_norm_affine", "fused_rms_norm",
           "fused_rms_norm_affine", "mixed_dtype_fused_layer_norm_affine",
           "mixed_dtype_fused_rms_norm_affine"]
