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


def half_sgd_run(make, dtype, device="cpu", steps=7, n=278011, seed=0, values=None):
    """Apex's TestFusedSGD.test_half set-up: uniform params and grads in [0, 1), held
    in ``values`` (default: dtype), stepped in ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    held = lambda t: t.to(values or dtype).to(device, dtype)  # noqa: E731
    p = torch.nn.Parameter(held(torch.rand(n, generator=g)))
    opt = make([p])
    for _ in range(steps):
        p.grad = held(torch.rand(n, generator=g))
        opt.step()
    return p.detach()


@pytest.mark.parametrize("which", ["native", "reference"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_sgd_on_half_params_rounds_as_torch(dtype, which, monkeypatch):
    """Note [Half params without masters]: without master weights a half param steps
    as torch.optim.SGD steps a half tensor, every op rounded to its dtype. With Apex's
    hyperparameters every product is exact (powers of two) and the results are equal
    bit for bit; Apex's test_half failed on an element that torch's run lands exactly
    on 0 (a relative difference of inf) while a float32 momentum buffer did not."""
    if which == "reference":
        import core_ops.optimizers.fused_sgd as module
        from core_ops.reference import KERNELS
        monkeypatch.setattr(module, "op", lambda name: KERNELS[name])
    kw = dict(lr=0.25, momentum=0.125)
    ours = half_sgd_run(lambda ps: FusedSGD(ps, **kw), dtype)
    theirs = half_sgd_run(lambda ps: torch.optim.SGD(ps, **kw), dtype)
    assert bool((theirs == 0).any())  # the case that failed
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("kw", [dict(momentum=0.9, dampening=0.1, weight_decay=0.01),
                                dict(momentum=0.9, nesterov=True, weight_decay=0.05)], ids=["dampening", "nesterov"])
def test_sgd_on_half_params_is_as_accurate_as_torch_with_any_hyperparameters(kw):
    """With coefficients that half cannot hold, torch itself differs by device (its CPU
    add rounds alpha to half, its CUDA add keeps it in float32), so the yardstick is
    accuracy: against the same steps in float64, our error is at most 1.5 times
    torch.optim.SGD's own on the same half tensors (Note [Test tolerances]' rule for
    low precision)."""
    ours = half_sgd_run(lambda ps: FusedSGD(ps, lr=0.05, **kw), torch.float16, n=20000)
    theirs = half_sgd_run(lambda ps: torch.optim.SGD(ps, lr=0.05, **kw), torch.float16, n=20000)
    exact = half_sgd_run(lambda ps: torch.optim.SGD(ps, lr=0.05, **kw), torch.float64, n=20000,
                         values=torch.float16)  # the same half inputs, stepped exactly
    ours_err = float((ours.double() - exact).abs().max())
    torch_err = float((theirs.double() - exact).abs().max())
    assert 0 < ours_err <= 1.5 * torch_err, (ours_err, torch_err)
