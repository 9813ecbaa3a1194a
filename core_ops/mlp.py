"""``MLP``: a stack of linear layers, each followed by the same activation (Apex's
``apex.mlp.MLP``, DLRM's bottom and top MLPs). Each layer is one ``addmm`` (the bias
fused into the matmul) and the activation, on any device; backward is autograd's.
Under ``torch.autocast`` the layers run in the autocast dtype, as Apex's did.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = {"none": 0, "relu": 1, "sigmoid": 2}
_APPLY = {0: lambda x: x, 1: F.relu, 2: torch.sigmoid}


def mlp_function(bias, activation, input, *weights_and_biases):
    """Apex's functional form: ``weights_and_biases`` is every layer's weight, then
    (``bias`` 1) every layer's bias; ``activation`` 0 none, 1 relu, 2 sigmoid."""
    if activation not in _APPLY:
        raise ValueError(f"activation must be one of {sorted(_APPLY)} (none, relu, sigmoid), got {activation!r}")
    layers = len(weights_and_biases) // (2 if bias else 1)
    weights, biases = weights_and_biases[:layers], weights_and_biases[layers:] if bias else [None] * layers
    out = input
    for w, b in zip(weights, biases):
        if out.shape[-1] != w.shape[1]:
            raise ValueError(f"MLP: the input's last dim is {out.shape[-1]}, the layer takes {w.shape[1]}")
        out = _APPLY[activation](F.linear(out, w, b))
    return out


class MLP(nn.Module):
    """``len(mlp_sizes) - 1`` linear layers, ``mlp_sizes[i] -> mlp_sizes[i + 1]``, each
    followed by ``activation`` ('relu', 'sigmoid' or 'none'), with Apex's parameter
    names (``weight_i``, ``bias_i``; lists ``weights``, ``biases``) and initialization
    (normal, std sqrt(2 / (fan_in + fan_out)) for weights, sqrt(1 / fan_out) for biases)."""

    def __init__(self, mlp_sizes, bias=True, activation="relu"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise TypeError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        if len(mlp_sizes) < 2 or any(int(s) < 1 for s in mlp_sizes):
            raise ValueError(f"mlp_sizes must be 2 or more positive sizes, got {list(mlp_sizes)}")
        self.num_layers = len(mlp_sizes) - 1
        self.mlp_sizes = list(mlp_sizes)
        self.bias = 1 if bias else 0
        self.activation = ACTIVATIONS[activation]
        self.weights, self.biases = [], []
        for i in range(self.num_layers):
            w = nn.Parameter(torch.empty(mlp_sizes[i + 1], mlp_sizes[i]))
            setattr(self, f"weight_{i}", w)
            self.weights.append(w)
            if self.bias:
                b = nn.Parameter(torch.empty(mlp_sizes[i + 1]))
                setattr(self, f"bias_{i}", b)
                self.biases.append(b)
        self.reset_parameters()

    def reset_parameters(self):
        for w in self.weights:
            nn.init.normal_(w, 0.0, math.sqrt(2.0 / (w.size(0) + w.size(1))))
        for b in self.biases:
            nn.init.normal_(b, 0.0, math.sqrt(1.0 / b.size(0)))

    def _apply(self, fn, *args, **kwargs):
        # .to() / .half() replace Parameters in place of their attributes: refresh the lists.
        result = super()._apply(fn, *args, **kwargs)
        self.weights = [getattr(self, f"weight_{i}") for i in range(self.num_layers)]
        self.biases = [getattr(self, f"bias_{i}") for i in range(self.num_layers)] if self.bias else []
        return result

    def forward(self, input):
        return mlp_function(self.bias, self.activation, input, *self.weights, *self.biases)

    def extra_repr(self):
        return f"MLP sizes: {self.mlp_sizes}, Bias={self.bias}, activation={self.activation}"
