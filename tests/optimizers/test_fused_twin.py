"""fused_twin: a torch.optim optimizer's core_ops twin takes over mid-run with the same
groups and state, and continues as torch's would (a few float32 ulps: the same
formula, Note [Adam as torch.optim computes it]), for every optimizer of the registry
with a torch.optim counterpart (optimizer_registry.py, generic test "twin"), in each
variant that torch's optimizer takes, on each device."""

import copy

import pytest
import torch
from optim_cases import DEVICES
from optimizer_registry import cases

from core_ops.optimizers import fused_twin


def params(device, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g).to(device).requires_grad_() for n in (300, 17)]


def steps(opt, ps, seeds):
    for s in seeds:
        g = torch.Generator().manual_seed(s)
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g).to(p.device)
        opt.step()


@pytest.mark.parametrize("info,config", cases("twin", "torch_counterpart", variants=True))
@pytest.mark.parametrize("device", DEVICES)
def test_the_twin_continues_as_torch_would(device, info, config):
    ours, theirs = params(device), params(device)

    def make(ps):
        return info.torch_optimizer([{"params": ps[:1]}, {"params": ps[1:], "lr": 0.05}], **config.kwargs)

    a, b = make(ours), make(theirs)
    sched = torch.optim.lr_scheduler.StepLR(a, 1, 0.5)  # puts initial_lr into the groups
    torch.optim.lr_scheduler.StepLR(b, 1, 0.5)
    steps(a, ours, [1, 2])
    steps(b, theirs, [1, 2])
    twin = fused_twin(a)
    assert type(twin) is info.cls and twin.param_groups[1]["params"][0] is ours[1]
    assert [g["lr"] for g in twin.param_groups] == [g["lr"] for g in a.param_groups]
    assert all(g["initial_lr"] == h["initial_lr"] for g, h in zip(twin.param_groups, a.param_groups))
    sched.optimizer = twin
    steps(twin, ours, [3, 4, 5])
    steps(b, theirs, [3, 4, 5])
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_no_twin_for_other_optimizers():
    ps = params("cpu")
    assert fused_twin(torch.optim.RMSprop(ps)) is None
    assert fused_twin(torch.optim.SGD(ps, lr=0.1, differentiable=True)) is None
    assert fused_twin(type("MyAdam", (torch.optim.Adam,), {})(ps)) is None
    assert fused_twin(copy.copy(torch.optim.Adam(ps))) is not None
