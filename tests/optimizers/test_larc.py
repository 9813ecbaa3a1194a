"""LARC against Apex's per-parameter formula (written out here with host-side norms), and LARC
as a torch.optim.Optimizer: schedulers, loss scales, copies."""

import copy
import pickle

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


def larc_sgd(params, **kw):
    return LARC(FusedSGD(params, lr=0.1, momentum=0.9, weight_decay=0.01, **kw))


def set_grads(params, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * scale


def test_larc_trains_param_groups_given_as_generators():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    opt = LARC(FusedSGD([{"params": model[0].parameters()}], lr=0.1))
    opt.add_param_group({"params": model[1].parameters(), "lr": 0.2})
    assert [len(g["params"]) for g in opt.param_groups] == [2, 2]
    before = [p.detach().clone() for p in model.parameters()]
    set_grads(list(model.parameters()), 1)
    opt.step()
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


@pytest.mark.parametrize("copier", ["deepcopy", "pickle"])
def test_a_copied_larc_steps_like_the_original(copier):
    params = make_params(sizes=(30, 5))
    opt = larc_sgd(params)
    set_grads(params, 1)
    opt.step()
    twin = copy.deepcopy(opt) if copier == "deepcopy" else pickle.loads(pickle.dumps(opt))
    assert (twin.trust_coefficient, twin.clip, twin.eps) == (0.02, True, 1e-8)
    twin_params = twin.param_groups[0]["params"]
    for seed in (2, 3):
        set_grads(params, seed), set_grads(twin_params, seed)
        opt.step(), twin.step()
    for p, q in zip(params, twin_params):
        assert torch.equal(p.detach(), q.detach())


@pytest.mark.parametrize("route", ["grad_scale", "grad_scaler"])
def test_scaled_grads_give_the_unscaled_update(route):
    # LARC's trust ratio and decay must see the true grads, whatever the loss scale.
    scale = 1024.0
    a = make_params(sizes=(30, 5))
    b = clone_params(a)
    la, lb = larc_sgd(a), larc_sgd(b)
    for seed in range(4):
        set_grads(a, seed)
        la.step()
        set_grads(b, seed, scale)
        if route == "grad_scale":
            lb.step(grad_scale=torch.tensor([scale]))
        else:
            scaler = torch.amp.GradScaler("cpu", init_scale=scale)
            scaler.scale(torch.ones(()))
            lb.step(grad_scaler=scaler)
    for p, q in zip(a, b):
        assert torch.equal(p.detach(), q.detach())  # scale is a power of two: exact


def test_found_inf_skips_the_wrapped_step():
    params = make_params(sizes=(30,))
    opt = larc_sgd(params)
    before = params[0].detach().clone()
    set_grads(params, 1)
    opt.step(grad_scale=torch.tensor([8.0]), found_inf=torch.ones(1))
    assert torch.equal(params[0].detach(), before)
    fresh_params = clone_params(params)
    fresh = larc_sgd(fresh_params)  # the next step is a first step, as if none was skipped
    set_grads(params, 2), set_grads(fresh_params, 2)
    opt.step(), fresh.step()
    assert torch.equal(params[0].detach(), fresh_params[0].detach())


def test_larc_is_an_optimizer_for_lr_schedulers():
    a = make_params(sizes=(30,))
    b = clone_params(a)
    opt = larc_sgd(a)
    ref = larc_sgd(b)
    assert isinstance(opt, torch.optim.Optimizer)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    lrs = []
    for seed in range(5):
        set_grads(a, seed), set_grads(b, seed)
        ref.param_groups[0]["lr"] = opt.param_groups[0]["lr"]  # the schedule, by hand
        opt.step(), ref.step(), sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs == [0.1, 0.05, 0.05, 0.025, 0.025]
    assert torch.equal(a[0].detach(), b[0].detach())
    copy.deepcopy(opt)  # the scheduler's wrapped step stays out of the copy


@pytest.mark.parametrize("set_grad_none", [False, True])
def test_zero_grad_follows_the_wrapped_optimizer(set_grad_none):
    params = make_params(sizes=(4,))
    opt = larc_sgd(params, set_grad_none=set_grad_none)
    set_grads(params, 1)
    opt.zero_grad()
    assert params[0].grad is None if set_grad_none else torch.equal(params[0].grad, torch.zeros(4))
    set_grads(params, 1)
    opt.zero_grad(set_to_none=True)
    assert params[0].grad is None


def test_scale_arguments_must_be_tensors():
    params = make_params(sizes=(4,))
    opt = larc_sgd(params)
    set_grads(params, 1)
    with pytest.raises(TypeError, match="grad_scale must be a one-element tensor"):
        opt.step(grad_scale=2.0)
    with pytest.raises(TypeError, match="found_inf must be a one-element tensor"):
        opt.step(found_inf=True)


def test_state_dict_hooks_registered_on_larc_run():
    opt = larc_sgd(make_params(sizes=(4,)))
    seen = []
    opt.register_state_dict_pre_hook(lambda o: seen.append(("pre", o is opt)))
    opt.register_state_dict_post_hook(lambda o, sd: {**sd, "tag": 1})
    opt.register_load_state_dict_pre_hook(lambda o, sd: seen.append(("load-pre", sd.get("tag"))))
    opt.register_load_state_dict_post_hook(lambda o: seen.append(("loaded", o is opt)))
    sd = opt.state_dict()
    assert sd["tag"] == 1 and seen == [("pre", True)]
    opt.load_state_dict(sd)
    assert seen == [("pre", True), ("load-pre", 1), ("loaded", True)]


def test_arguments_that_cannot_work_are_rejected_at_construction():
    p = torch.nn.Parameter(torch.ones(3))
    with pytest.raises(TypeError, match="LARC wraps an optimizer .* got list"):
        LARC([p])
    with pytest.raises(TypeError, match="lr must be a number or a one-element tensor, got None"):
        FusedSGD([p], lr=None)
