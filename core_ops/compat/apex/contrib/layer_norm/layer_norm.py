"""Apex's ``contrib.layer_norm``: ``FastLayerNorm(hidden_size, eps, memory_efficient)``
and the autograd function Megatron-LM calls directly,
``FastLayerNormFN.apply(x, weight, bias, eps, memory_efficient=False)``. The math is
core_ops' norm ops (float32 statistics); with ``memory_efficient`` backward works from
the saved output, so the input is not kept. Under autocast the inputs are
cast to its dtype, as Apex's were."""

from __future__ import annotations

import torch
from torch import nn

from ..... import native
from ....._schemas import op
from ..._autocast_utils import _cast_if_autocast_enabled


class FastLayerNormFN(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gamma, beta, epsilon, memory_efficient=False):
        hidden = gamma.numel()
        if x.shape[-1] != hidden or beta.numel() != hidden:
            raise ValueError(f"FastLayerNorm: the input's last dim ({x.shape[-1]}), gamma ({hidden}) and beta "
                             f"({beta.numel()}) must agree")
        native.ensure_for(x.device)
        y, mean, rstd = op("layer_norm_fwd")(x, gamma, beta, hidden, epsilon, None, memory_efficient)
        ctx.memory_efficient, ctx.dx_dtype = memory_efficient, x.dtype
        ctx.save_for_backward(y if memory_efficient else x, gamma, beta, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        saved, gamma, beta, mean, rstd = ctx.saved_tensors
        dx, dgamma, dbeta = op("layer_norm_bwd")(dy, saved, mean, rstd, gamma, beta, gamma.numel(),
                                                 ctx.memory_efficient, ctx.dx_dtype)
        return dx, dgamma, dbeta, None, None


def _fast_layer_norm(x, weight, bias, epsilon, memory_efficient):
    args = _cast_if_autocast_enabled(x, weight, bias, epsilon, memory_efficient)
    with torch.autocast(x.device.type, enabled=False):
        return FastLayerNormFN.apply(*args)


class FastLayerNorm(nn.Module):
    """Layer norm over the last dim of size ``hidden_size``, weight ones, bias zeros."""

    def __init__(self, hidden_size, eps=1e-5, memory_efficient=False):
        super().__init__()
        self.epsilon = eps
        self.memory_efficient = memory_efficient
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.bias = nn.Parameter(torch.zeros(hidden_size))

    def reset_parameters(self):
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)

    def forward(self, x):
        return _fast_layer_norm(x, self.weight, self.bias, self.epsilon, self.memory_efficient)
