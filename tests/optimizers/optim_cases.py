"""Helpers shared by the optimizer tests (Note [Optimizer tolerances] in test_fused_adam.py)."""

import copy

import torch

STEPS = 20
SIZES = (1, 16, 17, 16383, 16385, 40000)


def ulps_close(actual, expected, n=8):
    scale = expected.abs().max().item() if expected.numel() else 1.0
    tol = n * torch.finfo(expected.dtype).eps * max(scale, 1e-30)
    torch.testing.assert_close(actual, expected, rtol=0, atol=tol)


def make_params(dtype=torch.float32, seed=0, sizes=SIZES):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g).to(dtype).requires_grad_() for n in sizes]


def clone_params(ps, dtype=None):
    return [p.detach().clone().to(dtype or p.dtype).requires_grad_() for p in ps]


def run(opt, params, steps=STEPS, seed=1, **step_kwargs):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g).to(p.dtype)
        opt.step(**step_kwargs)


def assert_same_run(make_ours, make_theirs, dtype=torch.float32, n=8, steps=STEPS):
    """Both optimizers from the same params and grads end within n ulps."""
    ours = make_params(dtype)
    theirs = clone_params(ours)
    run(make_ours(ours), ours, steps)
    run(make_theirs(theirs), theirs, steps)
    for a, b in zip(ours, theirs):
        if dtype == torch.float64:
            torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-12, atol=1e-12)
        else:
            ulps_close(a.detach(), b.detach(), n)


def assert_state_dict_round_trip(make_ours, make_theirs):
    """torch -> ours and ours -> torch, each continuing with the same results."""
    for first, second in ((make_theirs, make_ours), (make_ours, make_theirs)):
        a = make_params(sizes=(64, 7))
        src = first(a)
        run(src, a, steps=4)
        b = clone_params(a)
        dst = second(b)
        dst.load_state_dict(copy.deepcopy(src.state_dict()))
        run(src, a, steps=4, seed=7)
        run(dst, b, steps=4, seed=7)
        for p, q in zip(a, b):
            ulps_close(q.detach(), p.detach())
