"""The norm ops' one autograd (Note [Norm autograd] in _schemas.py), in Python over
whichever kernel a device has, native or reference: torch's grads, the forward's input
or output kept for backward as memory_efficient says, no grad for the statistics nor
from an output left unused."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from core_ops import native
from core_ops._schemas import op
from core_ops.normalization.fused import fused_add_rms_norm, layer_norm, rms_norm

GENERATED = "GeneratedBackwardFor_core_ops_{}_fwd_defaultBackward"

# Grads of the three public norms against torch's unfused forms, and their grad_fn.
CHECK = """
import torch, torch.nn.functional as F
from core_ops.normalization.fused import fused_add_rms_norm, layer_norm, rms_norm
torch.manual_seed(0)
x, r, dy = (torch.randn(5, 24, dtype=torch.float64) for _ in range(3))
w, b = torch.rand(24, dtype=torch.float64) + 0.5, torch.randn(24, dtype=torch.float64)
def grads(fn, *ts):
    leaves = [t.clone().requires_grad_() for t in ts]
    out = fn(*leaves)
    out = out if isinstance(out, tuple) else (out,)
    sum((o * dy).sum() for o in out).backward()
    return out[0].grad_fn.name(), [l.grad for l in leaves]
cases = [
    (lambda x, w, b: layer_norm(x, (24,), w, b), lambda x, w, b: F.layer_norm(x, (24,), w, b), (x, w, b)),
    (lambda x, w: rms_norm(x, (24,), w), lambda x, w: F.rms_norm(x, (24,), w, 1e-5), (x, w)),
    (lambda x, r, w: fused_add_rms_norm(x, r, w), lambda x, r, w: (F.rms_norm(x + r, (24,), w, 1e-5), x + r),
     (x, r, w)),
]
for ours, torchs, ts in cases:
    name, got = grads(ours, *ts)
    _, want = grads(torchs, *ts)
    assert all(torch.allclose(g, t, rtol=1e-10, atol=1e-12) for g, t in zip(got, want)), name
    print("GRAD_FN", name)
from core_ops import native
print("NATIVE", native.ensure("cpu").native)
"""


def test_native_norms_use_the_python_autograd(device):
    if not native.ensure(device).native:
        pytest.fail(f"native {device} kernels did not load")
    x = torch.randn(3, 16, device=device, requires_grad=True)
    w = torch.rand(16, device=device, requires_grad=True)
    assert layer_norm(x, (16,), w, w).grad_fn.name() == GENERATED.format("layer_norm")
    assert rms_norm(x, (16,), w).grad_fn.name() == GENERATED.format("rms_norm")
    y, h = fused_add_rms_norm(x, x, w)
    assert y.grad_fn.name() == h.grad_fn.name() == GENERATED.format("fused_add_rms_norm")


@pytest.mark.parametrize("backend", ["native", "reference"])
def test_grads_equal_torch_on_either_backend(backend):
    env = dict(os.environ)
    env.pop("CORE_OPS_BACKEND", None)
    if backend == "reference":
        env["CORE_OPS_BACKEND"] = "reference"
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    names = [line.split(" ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("GRAD_FN")]
    assert names == [GENERATED.format(n) for n in ("layer_norm", "rms_norm", "fused_add_rms_norm")]
    assert f"NATIVE {backend == 'native'}" in proc.stdout.splitlines()


def test_fused_add_rms_norm_with_one_output_unused(device):
    x, r, dy = (torch.randn(4, 32, device=device) for _ in range(3))
    w = torch.rand(32, device=device) + 0.5
    for used in ("y", "h"):
        leaves = [t.clone().requires_grad_() for t in (x, r, w)]
        y, h = fused_add_rms_norm(*leaves, eps=1e-6)
        ((y if used == "y" else h) * dy).sum().backward()
        twins = [t.clone().requires_grad_() for t in (x, r, w)]
        h2 = twins[0] + twins[1]
        ((F.rms_norm(h2, (32,), twins[2], 1e-6) if used == "y" else h2) * dy).sum().backward()
        for a, b in zip(leaves, twins):
            if b.grad is None:  # w when only h is used: no grad reaches it
                assert a.grad is None
            else:
                torch.testing.assert_close(a.grad, b.grad, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("memory_efficient", [False, True], ids=["saves_x", "saves_y"])
def test_gradcheck_fp64(device, memory_efficient):
    x = torch.randn(3, 2, 9, device=device, dtype=torch.float64, requires_grad=True)
    w = (torch.rand(9, device=device, dtype=torch.float64) + 0.5).requires_grad_()
    b = torch.randn(9, device=device, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: layer_norm(x, (9,), w, b, memory_efficient=memory_efficient),
                                    (x, w, b))
    assert torch.autograd.gradcheck(lambda x, w: rms_norm(x, (9,), w, memory_efficient=memory_efficient), (x, w))
    assert torch.autograd.gradcheck(lambda x, r, w: fused_add_rms_norm(x, r, w, memory_efficient=memory_efficient),
                                    (x, torch.randn_like(x, requires_grad=True), w))


# What each norm reads (h = x + r for the fused form) and what it writes.
NORMS = {
    "layer_norm": lambda x, r, w, me: (x, layer_norm(x, (64,), w, None, memory_efficient=me)),
    "rms_norm": lambda x, r, w, me: (x, rms_norm(x, (64,), w, memory_efficient=me)),
    "fused_add_rms_norm": lambda x, r, w, me: fused_add_rms_norm(x, r, w, memory_efficient=me)[::-1],
}


@pytest.mark.parametrize("norm", list(NORMS))
def test_memory_efficient_saves_the_output_not_the_input(device, norm):
    x = torch.randn(8, 64, device=device, requires_grad=True)
    r = torch.randn(8, 64, device=device)
    w = torch.rand(64, device=device).add(0.5).requires_grad_()
    results = {}
    for me in (False, True):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            read, y = NORMS[norm](x, r, w, me)
        keeps_input = any(t.data_ptr() == read.data_ptr() for t in saved)
        keeps_output = any(t.data_ptr() == y.data_ptr() for t in saved)
        assert (keeps_input, keeps_output) == ((False, True) if me else (True, False))
        results[me] = torch.autograd.grad(y, (x, w), torch.ones_like(y))
    for a, b in zip(results[False], results[True]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)  # xhat from y: a few float32 roundings


def test_statistics_take_no_grad(device):
    x = torch.randn(4, 8, device=device, requires_grad=True)
    w = torch.rand(8, device=device, requires_grad=True)
    out, mean, rstd = op("layer_norm_fwd")(x, w, w, 8, 1e-5, None, False)
    rms_out, rms_rstd = op("rms_norm_fwd")(x, w, 8, 1e-5, None, False)
    y, h, add_rstd = op("fused_add_rms_norm_fwd")(x, x, w, 8, 1e-5, False)
    assert [t.requires_grad for t in (out, rms_out, y, h)] == [True] * 4
    assert [t.requires_grad for t in (mean, rstd, rms_rstd, add_rstd)] == [False] * 4


class _SendsNoGrad(torch.autograd.Function):
    """Passes its input on; its backward sends None to the node before it."""

    @staticmethod
    def forward(ctx, t):
        return t.clone()

    @staticmethod
    def backward(ctx, grad):
        return None


@pytest.mark.parametrize("norm", list(NORMS))
def test_an_output_sent_no_grad_gives_no_grad(device, norm):
    """The norm's node runs with None for its output's grad (grads are not materialized)
    and sends None on: x and w get no grad, not zeros."""
    x = torch.randn(8, 64, device=device, requires_grad=True)
    w = torch.rand(64, device=device, requires_grad=True)
    _, y = NORMS[norm](x, torch.randn(8, 64, device=device), w, False)
    _SendsNoGrad.apply(y).sum().backward()
    assert x.grad is None and w.grad is None
