"""Apex's normalization modules (``apex.normalization``) on torch's own fused
``layer_norm`` / ``rms_norm`` kernels, which are as fast as Apex's on CPU and CUDA.
Their state dicts are those of ``nn.LayerNorm`` / ``nn.RMSNorm``."""

from torch import nn

from .functional import (  # and Apex's other fused_layer_norm names
    FusedLayerNormAffineFunction, FusedLayerNormAffineMixedDtypesFunction, FusedLayerNormFunction,
    FusedRMSNormAffineFunction, FusedRMSNormAffineMixedDtypesFunction, FusedRMSNormFunction,
    autocast_dtype, fused_layer_norm, fused_layer_norm_affine, fused_rms_norm, fused_rms_norm_affine,
    mixed_dtype_fused_layer_norm_affine, mixed_dtype_fused_rms_norm_affine)


class FusedLayerNorm(nn.LayerNorm):
    """``apex.normalization.FusedLayerNorm``: ``nn.LayerNorm`` with Apex's arguments
    (``memory_efficient`` is accepted; torch's kernel already saves only the stats).
    Under autocast the output is in the autocast dtype (Note [Norms under autocast])."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, memory_efficient=False):
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine)

    def forward(self, input):
        if autocast_dtype(input) is None:
            return super().forward(input)
        return fused_layer_norm_affine(input, self.weight, self.bias, self.normalized_shape, self.eps)


class FusedRMSNorm(nn.RMSNorm):
    """``apex.normalization.FusedRMSNorm``: ``y = x / sqrt(mean(x^2) + eps) * weight``.
    Under autocast the output is in the autocast dtype (Note [Norms under autocast])."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, memory_efficient=False):
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine)

    def forward(self, input):
        if autocast_dtype(input) is None:
            return super().forward(input)
        return fused_rms_norm_affine(input, self.weight, self.normalized_shape, self.eps)


class MixedFusedLayerNorm(FusedLayerNorm):
    """Float32 weights applied to half inputs, statistics in float32, output in the
    weights' dtype (Apex's "mixed" variant, used with O2-style half models)."""

    def forward(self, x):
        if self.weight is None:
            return fused_layer_norm_affine(x, None, None, self.normalized_shape, self.eps)
        return mixed_dtype_fused_layer_norm_affine(x, self.weight, self.bias, self.normalized_shape,
                                                   self.eps)


class MixedFusedRMSNorm(FusedRMSNorm):
    """Float32 weight, half input, float32 statistics, output in the weight's dtype."""

    def forward(self, x):
        if self.weight is None:
            return fused_rms_norm_affine(x, None, self.normalized_shape, self.eps)
        return mixed_dtype_fused_rms_norm_affine(x, self.weight, self.normalized_shape, self.eps)


__all__ = ["FusedLayerNorm", "FusedLayerNormAffineFunction", "FusedLayerNormAffineMixedDtypesFunction",
           "FusedLayerNormFunction", "FusedRMSNorm", "FusedRMSNormAffineFunction",
           "FusedRMSNormAffineMixedDtypesFunction", "FusedRMSNormFunction", "MixedFusedLayerNorm",
           "MixedFusedRMSNorm", "fused_layer_norm", "fused_layer_norm_affine", "fused_rms_norm",
           "fused_rms_norm_affine", "mixed_dtype_fused_layer_norm_affine",
           "mixed_dtype_fused_rms_norm_affine"]
