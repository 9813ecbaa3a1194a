"""FusedSGD and FusedAdagrad against torch.optim.SGD / Adagrad (Note [Optimizer
tolerances] in test_fused_adam.py), and the behaviour they share with FusedAdam."""

import copy

import pytest
import torch
from optim_cases import (assert_same_run, assert_state_dict_round_trip, clone_params, make_params,
                         run, ulps_close)

from core_ops import _build
from core_ops.optimizers import FusedAdagrad, FusedSGD


@pytest.fixture(autouse=True)
def _native():
    assert _build.ensure("cpu").native


SGD_CASES = [dict(), dict(momentum=0.9), dict(momentum=0.9, dampening=0.3, weight_decay=0.01),
             dict(momentum=0.9, nesterov=True, weight_decay=0.01), dict(weight_decay=0.1),
             dict(momentum=0.5, maximize=True)]


@pytest.mark.parametrize("kw", SGD_CASES, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()) or "plain")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_sgd_matches_torch(kw, dtype):
    assert_same_run(lambda p: FusedSGD(p, lr=0.05, **kw), lambda p: torch.optim.SGD(p, lr=0.05, **kw), dtype)


def test_sgd_fused_baseline_too():
    kw = dict(lr=0.05, momentum=0.9, weight_decay=0.01)
    assert_same_run(lambda p: FusedSGD(p, **kw), lambda p: torch.optim.SGD(p, fused=True, **kw))


def test_sgd_wd_after_momentum_matches_reference_formula():
    p = make_params(sizes=(100,))
    q = p[0].detach().clone()
    opt = FusedSGD(p, lr=0.1, momentum=0.9, weight_decay=0.1, wd_after_momentum=True)
    buf = None
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        grad = torch.randn(100, generator=g)
        p[0].grad = grad
        opt.step()
        buf = grad.clone() if buf is None else buf * 0.9 + grad
        q = q - 0.1 * (buf + 0.1 * q)
    ulps_close(p[0].detach(), q, n=16)


@pytest.mark.parametrize("kw", [dict(), dict(weight_decay=0.01), dict(lr_decay=0.05, initial_accumulator_value=0.2),
                                dict(maximize=True, eps=1e-6)], ids=["plain", "wd", "lr_decay", "maximize"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_adagrad_matches_torch(kw, dtype):
    assert_same_run(lambda p: FusedAdagrad(p, lr=0.05, **kw), lambda p: torch.optim.Adagrad(p, lr=0.05, **kw), dtype)


def test_adagrad_w_mode_decouples_weight_decay():
    p = make_params(sizes=(100,))
    q = p[0].detach().clone()
    opt = FusedAdagrad(p, lr=0.1, weight_decay=0.1, adagrad_w_mode=True)
    s = torch.zeros(100)
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        grad = torch.randn(100, generator=g)
        p[0].grad = grad
        opt.step()
        s = s + grad * grad
        q = q - 0.1 * (grad / (s.sqrt() + 1e-10) + 0.1 * q)
    ulps_close(p[0].detach(), q, n=16)


@pytest.mark.parametrize("make_ours,make_theirs", [
    (lambda p: FusedSGD(p, lr=0.1, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
    (lambda p: FusedAdagrad(p, lr=0.1), lambda p: torch.optim.Adagrad(p, lr=0.1)),
], ids=["sgd", "adagrad"])
def test_state_dicts_interoperate_with_torch(make_ours, make_theirs):
    assert_state_dict_round_trip(make_ours, make_theirs)


@pytest.mark.parametrize("make", [lambda p: FusedSGD(p, lr=0.1, momentum=0.9, master_weights=True),
                                  lambda p: FusedAdagrad(p, lr=0.1, master_weights=True)], ids=["sgd", "adagrad"])
def test_master_weights_and_skipped_steps(make):
    ours = make_params(torch.bfloat16, sizes=(300, 17))
    fp32 = clone_params(ours, torch.float32)
    opt = make(ours)
    ref = make(fp32)
    g = torch.Generator().manual_seed(3)
    for _ in range(6):
        for a, b in zip(ours, fp32):
            grad = torch.randn(a.shape, generator=g).to(torch.bfloat16)
            a.grad, b.grad = grad, grad.float()
        opt.step()
        ref.step()
    for a, b in zip(ours, fp32):
        ulps_close(opt.state[a]["master_param"], b.detach())
        assert torch.equal(a.detach(), opt.state[a]["master_param"].to(torch.bfloat16))
    before = [p.detach().clone() for p in ours], copy.deepcopy(opt.state_dict())
    run(opt, ours, steps=1, found_inf=torch.ones(1))
    assert all(torch.equal(a, b) for a, b in zip(before[0], ours))
    for k, st in before[1]["state"].items():
        for key, value in st.items():
            assert torch.equal(value, opt.state_dict()["state"][k][key])


def test_sgd_bad_input():
    p = torch.zeros(3, requires_grad=True)
    with pytest.raises(ValueError, match="nesterov"):
        FusedSGD([p], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="momentum"):
        FusedSGD([p], lr=0.1, momentum=-1)
    with pytest.raises(ValueError, match="param group 0: .* required optimization parameter lr"):
        FusedSGD([p])  # lr is required (from the constructor or every group), as in Apex
    q = torch.zeros(2, requires_grad=True)
    opt = FusedSGD([{"params": [p], "lr": 0.5}])  # Apex's lr=required: the groups give it
    with pytest.raises(ValueError, match="param group 1: .* required optimization parameter lr"):
        opt.add_param_group({"params": [q]})
    assert len(opt.param_groups) == 1
    opt.add_param_group({"params": [q], "lr": 0.25})
    p.grad, q.grad = torch.ones(3), torch.ones(2)
    opt.step()
    assert p.tolist() == [-0.5] * 3 and q.tolist() == [-0.25] * 2
    opt = FusedAdagrad([p])
    p.grad = torch.zeros(3).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        opt.step()
