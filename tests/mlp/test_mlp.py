"""``core_ops.mlp.MLP`` (Apex's ``apex.mlp.MLP``) against the same layers built from
``nn.Linear`` and the activation modules, in float64 (equal up to the order of one
matmul's sums) and float32."""

import math

import pytest
import torch
from torch import nn

from core_ops.mlp import MLP, mlp_function

SIZES = [12, 16, 9, 1]


def reference(mlp, activation, bias):
    layers = []
    for i in range(mlp.num_layers):
        linear = nn.Linear(SIZES[i], SIZES[i + 1], bias=bias, dtype=mlp.weights[i].dtype)
        with torch.no_grad():
            linear.weight.copy_(mlp.weights[i])
            if bias:
                linear.bias.copy_(mlp.biases[i])
        layers.append(linear)
        layers += {"relu": [nn.ReLU()], "sigmoid": [nn.Sigmoid()], "none": []}[activation]
    return nn.Sequential(*layers)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("activation", ["none", "relu", "sigmoid"])
def test_mlp_equals_linear_layers(activation, bias, dtype):
    torch.manual_seed(0)
    mlp = MLP(SIZES, bias=bias, activation=activation).to(dtype)
    ref = reference(mlp, activation, bias)
    x = torch.empty(33, SIZES[0], dtype=dtype).uniform_(-1, 1).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    out, ref_out = mlp(x), ref(x_ref)
    # The same ops as nn.Linear (addmm): identical in both dtypes.
    assert torch.equal(out, ref_out)
    out.mean().mul(10).backward()
    ref_out.mean().mul(10).backward()
    assert torch.equal(x.grad, x_ref.grad)
    linears = [m for m in ref if isinstance(m, nn.Linear)]
    for i, linear in enumerate(linears):
        assert torch.equal(mlp.weights[i].grad, linear.weight.grad)
        if bias:
            assert torch.equal(mlp.biases[i].grad, linear.bias.grad)
    # Apex's names, in its order (state dicts load both ways).
    assert [n for n, _ in mlp.named_parameters()] == [
        n for i in range(3) for n in ([f"weight_{i}", f"bias_{i}"] if bias else [f"weight_{i}"])]


def test_autocast_runs_the_layers_in_its_dtype():
    mlp = MLP(SIZES)
    with torch.autocast("cpu", dtype=torch.float16):
        out = mlp(torch.randn(4, SIZES[0]))
    assert out.dtype == torch.float16
    out.float().sum().backward()
    assert mlp.weights[0].grad.dtype == torch.float32


def test_initialization_follows_apex():
    torch.manual_seed(0)
    mlp = MLP([512, 1024, 256])
    for w in mlp.weights:
        want = math.sqrt(2.0 / (w.size(0) + w.size(1)))
        assert abs(w.std().item() / want - 1) < 0.02  # 5e5 samples: a 0.2% standard error
    assert abs(mlp.biases[0].std().item() / math.sqrt(1 / 1024) - 1) < 0.1  # 1024 samples


def test_the_functional_form_and_half_models():
    mlp = MLP(SIZES, activation="sigmoid").half()
    assert mlp.weights[0].dtype == torch.float16 and mlp.weights[0] is mlp.weight_0
    x = torch.randn(2, SIZES[0]).half()
    assert torch.equal(mlp(x), mlp_function(1, 2, x, *mlp.weights, *mlp.biases))


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="activation must be one of"):
        MLP(SIZES, activation="gelu")
    with pytest.raises(ValueError, match="mlp_sizes must be 2 or more"):
        MLP([4])
    with pytest.raises(ValueError, match="the input's last dim is 5, the layer takes 12"):
        MLP(SIZES)(torch.randn(2, 5))
