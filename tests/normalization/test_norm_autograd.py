"""The norm ops' two autograd registrations (csrc/include/core_ops/norm_autograd.h):
C++ at a device's own autograd key where its native library is loaded, Python at the
Autograd alias key for the reference kernels. Both give torch's grads; outputs left
unused get no grad."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from core_ops import _build
from core_ops.normalization.fused import fused_add_rms_norm, layer_norm, rms_norm

CPP_NODE = "torch::autograd::CppNode<core_ops::norm_autograd::{}>"

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
"""


def test_native_norms_use_the_cpp_autograd(device):
    if not _build.ensure(device).native:
        pytest.fail(f"native {device} kernels did not load")
    x = torch.randn(3, 16, device=device, requires_grad=True)
    w = torch.rand(16, device=device, requires_grad=True)
    assert layer_norm(x, (16,), w, w).grad_fn.name() == CPP_NODE.format("LayerNorm")
    assert rms_norm(x, (16,), w).grad_fn.name() == CPP_NODE.format("RmsNorm")
    y, h = fused_add_rms_norm(x, x, w)
    assert y.grad_fn.name() == h.grad_fn.name() == CPP_NODE.format("FusedAddRmsNorm")


@pytest.mark.parametrize("backend", ["native", "reference"])
def test_grads_equal_torch_on_either_autograd(backend):
    env = dict(os.environ)
    env.pop("CORE_OPS_BACKEND", None)
    if backend == "reference":
        env["CORE_OPS_BACKEND"] = "reference"
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    names = [line.split(" ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("GRAD_FN")]
    if backend == "native":
        assert names == [CPP_NODE.format(n) for n in ("LayerNorm", "RmsNorm", "FusedAddRmsNorm")]
    else:
        assert names == [f"GeneratedBackwardFor_core_ops_{n}_fwd_defaultBackward"
                         for n in ("layer_norm", "rms_norm", "fused_add_rms_norm")]


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
