"""LARC against Apex's per-parameter formula, written out here with host-side norms."""

import pytest
import torch
from optim_cases import clone_params, make_params, ulps_close

from core_ops.optimizers import FusedSGD
from core_ops.optimizers.larc import LARC


def apex_larc_step(params, lr, wd, tc=0.02, clip=True, eps=1e-8, momentum=0.0, bufs=None):
    """Apex's LARC.step around torch.optim.SGD, one param at a time."""
    for i, p in enumerate(params):
        g = p.grad
        pn, gn = p.norm().item(), g.norm().item()
        if pn != 0 and gn != 0:
            a = tc * pn / (gn + pn * wd + eps)
            if clip:
                a = min(a / lr, 1.0)
            g = (g + wd * p) * a
        if momentum:
            bufs[i] = g.clone() if bufs[i] is None else bufs[i] * momentum + g
            g = bufs[i]
        p.data.add_(g, alpha=-lr)


@pytest.mark.parametrize("clip", [True, False])
def test_larc_matches_apex_formula(clip):
    ours = make_params(sizes=(100, 30, 5))
    theirs = clone_params(ours)
    with torch.no_grad():
        ours[2].zero_()  # a zero-norm weight: left as is, no decay
        theirs[2].zero_()
    opt = LARC(FusedSGD(ours, lr=0.5, momentum=0.9, weight_decay=0.01), clip=clip)
    bufs = [None] * 3
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        for a, b in zip(ours, theirs):
            a.grad = torch.randn(a.shape, generator=g)
            b.grad = a.grad.clone()
        opt.step()
        apex_larc_step(theirs, 0.5, 0.01, clip=clip, momentum=0.9, bufs=bufs)
    for a, b in zip(ours, theirs):
        ulps_close(a.detach(), b.detach(), n=64)  # norms summed in another order
    assert opt.param_groups[0]["weight_decay"] == 0.01  # restored after the step


def test_larc_forwards_the_optimizer_interface():
    p = make_params(sizes=(4,))
    inner = FusedSGD(p, lr=0.1)
    opt = LARC(inner)
    assert opt.param_groups is inner.param_groups and opt.state is inner.state
    sched = torch.optim.lr_scheduler.StepLR(inner, 1, gamma=0.5)
    sched.step()
    assert opt.param_groups[0]["lr"] == 0.05
    with pytest.raises(ValueError, match="trust_coefficient"):
        LARC(inner, trust_coefficient=0)
