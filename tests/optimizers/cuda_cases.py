"""Helpers shared by the CUDA optimizer tests (tests/optimizers/test_fused_*_cuda.py):
the same params and grads on every device, running an optimizer over them, and the
ulps comparison of Note [CUDA optimizer tolerances] in test_fused_adam_cuda.py."""

import copy

import pytest
import torch


STEPS = 20
# 2 * 65536 + 5: one tensor over three chunks (three blocks read one step count).
SIZES = (1, 16, 17, 16383, 16385, 2 * 65536 + 5, 40000)


@pytest.fixture(autouse=True)
def _both_native(both_native):
    """Autouse in each test file that imports it: tests/conftest.py's both_native."""


def ulps_close(actual, expected, n):
    """|actual - expected| <= n float32 ulps of the largest |expected| (Note above)."""
    actual, expected = actual.detach().double().cpu(), expected.detach().double().cpu()
    scale = expected.abs().max().item() if expected.numel() else 1.0
    tol = n * torch.finfo(torch.float32).eps * max(scale, 1e-30)
    torch.testing.assert_close(actual, expected, rtol=0, atol=tol)


def make_params(device, dtype=torch.float32, seed=0, sizes=SIZES):
    """The same values on every device: drawn on the CPU, then moved."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g).to(dtype).to(device).requires_grad_() for n in sizes]


def make_grads(sizes=SIZES, steps=STEPS, seed=1, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(n, generator=g).to(dtype) for n in sizes] for _ in range(steps)]


def run(opt, params, grads, dtype=None, **step_kwargs):
    for step_grads in grads:
        for p, grad in zip(params, step_grads):
            p.grad = grad.to(device=p.device, dtype=dtype or p.dtype)
        opt.step(**step_kwargs)


def snapshot(opt, params):
    return [p.detach().clone() for p in params], copy.deepcopy(opt.state_dict())


def assert_unchanged(before, opt, params):
    ps, sd = before
    assert all(torch.equal(a, b.detach()) for a, b in zip(ps, params))
    now = opt.state_dict()
    for k, st in sd["state"].items():
        for key, value in st.items():
            assert torch.equal(value, now["state"][k][key]), key  # steps and master_param included
