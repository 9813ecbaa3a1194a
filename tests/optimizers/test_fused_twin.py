"""fused_twin: a torch.optim optimizer's core_ops twin takes over mid-run with the same
groups and state, and continues as torch's would (a few float32 ulps: the same
formula, Note [Adam as torch.optim computes it])."""

import copy

import pytest
import torch

from core_ops.optimizers import FusedAdagrad, FusedAdam, FusedSGD, fused_twin

CASES = {
    "AdamW": (lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.05, amsgrad=True), FusedAdam),
    "Adam-L2": (lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.05), FusedAdam),
    "SGD": (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3), FusedSGD),
    "Adagrad": (lambda ps: torch.optim.Adagrad(ps, lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1), FusedAdagrad),
}


def params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g).requires_grad_() for n in (300, 17)]


def steps(opt, ps, seeds):
    for s in seeds:
        g = torch.Generator().manual_seed(s)
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()


@pytest.mark.parametrize("name", list(CASES))
def test_the_twin_continues_as_torch_would(name):
    make, cls = CASES[name]
    ours, theirs = params(), params()
    a = make([{"params": ours[:1]}, {"params": ours[1:], "lr": 0.05}])
    b = make([{"params": theirs[:1]}, {"params": theirs[1:], "lr": 0.05}])
    sched = torch.optim.lr_scheduler.StepLR(a, 1, 0.5)  # puts initial_lr into the groups
    torch.optim.lr_scheduler.StepLR(b, 1, 0.5)
    steps(a, ours, [1, 2])
    steps(b, theirs, [1, 2])
    twin = fused_twin(a)
    assert type(twin) is cls and twin.param_groups[1]["params"][0] is ours[1]
    assert [g["lr"] for g in twin.param_groups] == [g["lr"] for g in a.param_groups]
    assert all(g["initial_lr"] == h["initial_lr"] for g, h in zip(twin.param_groups, a.param_groups))
    sched.optimizer = twin
    steps(twin, ours, [3, 4, 5])
    steps(b, theirs, [3, 4, 5])
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_no_twin_for_other_optimizers():
    ps = params()
    assert fused_twin(torch.optim.RMSprop(ps)) is None
    assert fused_twin(torch.optim.SGD(ps, lr=0.1, differentiable=True)) is None
    assert fused_twin(type("MyAdam", (torch.optim.Adam,), {})(ps)) is None
    assert fused_twin(copy.copy(torch.optim.Adam(ps))) is not None
