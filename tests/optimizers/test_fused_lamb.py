"""FusedLAMB against LAMB written from the paper (You et al. 2019, Algorithm 2, with
Apex's options) in float64, and the native CPU kernel against the reference kernel.

Tolerances: float64 runs agree with the paper to 1e-12 (same operations, different
order); the fp32 native kernel and the fp32 reference kernel round the same
operations the same way, so they agree to a few ulps (8, Note [Optimizer tolerances]).
"""

import copy

import pytest
import torch
from optim_cases import clone_params, make_params, run, ulps_close

from core_ops import _build
from core_ops.multi_tensor_apply import ops
from core_ops.optimizers import FusedLAMB, FusedMixedPrecisionLamb
from core_ops.reference import KERNELS as REF


@pytest.fixture(autouse=True)
def _native():
    assert _build.ensure("cpu").native


def lamb_paper(params, grad_steps, lr=1e-2, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01,
               max_grad_norm=1.0, adam_w_mode=True, grad_averaging=True, bias_correction=True,
               use_nvlamb=False):
    b1, b2 = betas
    b3 = 1 - b1 if grad_averaging else 1.0
    ps = [p.detach().double().clone() for p in params]
    ms = [torch.zeros_like(p) for p in ps]
    vs = [torch.zeros_like(p) for p in ps]
    for t, grads in enumerate(grad_steps, 1):
        grads = [g.double() for g in grads]
        norm = torch.sqrt(sum((g * g).sum() for g in grads))
        clip = max(norm.item() / max_grad_norm, 1.0) if max_grad_norm else 1.0
        for p, g, m, v in zip(ps, grads, ms, vs):
            g = g / clip
            if not adam_w_mode:
                g = g + weight_decay * p
            m.mul_(b1).add_(b3 * g)
            v.mul_(b2).add_((1 - b2) * g * g)
            bc1, bc2 = (1 - b1 ** t, 1 - b2 ** t) if bias_correction else (1.0, 1.0)
            u = (m / bc1) / ((v / bc2).sqrt() + eps)
            if adam_w_mode:
                u = u + weight_decay * p
            pn, un = p.norm().item(), u.norm().item()
            ratio = pn / un if (weight_decay != 0 or use_nvlamb) and pn > 0 and un > 0 else 1.0
            p.sub_(lr * ratio * u)
    return ps


def grad_steps(params, steps=10, seed=1, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(p.shape, generator=g) * scale for p in params] for _ in range(steps)]


@pytest.mark.parametrize("kw", [dict(), dict(adam_w_mode=False), dict(grad_averaging=False),
                                dict(bias_correction=False), dict(weight_decay=0.0),
                                dict(weight_decay=0.0, use_nvlamb=True), dict(max_grad_norm=0.0)],
                         ids=["default", "l2", "no_averaging", "no_bias_correction", "no_wd", "nvlamb",
                              "no_clip"])
def test_fp64_matches_the_paper(kw):
    params = make_params(torch.float64, sizes=(40, 7, 300))
    steps = grad_steps(params, scale=0.3)
    expected = lamb_paper(params, steps, **kw)
    opt = FusedLAMB(params, lr=1e-2, **kw)
    for grads in steps:
        for p, g in zip(params, grads):
            p.grad = g.double()
        opt.step()
    for p, e in zip(params, expected):
        torch.testing.assert_close(p.detach(), e, rtol=1e-12, atol=1e-12)


def test_native_fp32_matches_reference_kernels(monkeypatch):
    a = make_params(sizes=(16385, 33))
    b = clone_params(a)
    native = FusedLAMB(a, lr=1e-2)
    run(native, a, steps=10)
    monkeypatch.setattr("core_ops.optimizers.fused_lamb.op", lambda name: REF[name])
    monkeypatch.setattr(ops, "op", lambda name: REF[name])
    reference = FusedLAMB(b, lr=1e-2)
    run(reference, b, steps=10)
    for p, q in zip(a, b):
        ulps_close(p.detach(), q.detach())


def test_mixed_precision_lamb_keeps_fp32_masters():
    ours = make_params(torch.bfloat16, sizes=(300, 17))
    fp32 = clone_params(ours, torch.float32)
    opt = FusedMixedPrecisionLamb(ours, lr=1e-2, reduced_precision_dtype=torch.bfloat16)
    ref = FusedLAMB(fp32, lr=1e-2)
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


def test_skip_scale_and_state_dict():
    a = make_params(sizes=(100, 3))
    b = clone_params(a)
    oa, ob = FusedLAMB(a, lr=1e-2), FusedLAMB(b, lr=1e-2)
    for steps, (p, q) in enumerate([(a, b)] * 3):
        grads = [torch.randn(x.shape) for x in p]
        for x, y, g in zip(p, q, grads):
            x.grad, y.grad = g * 64, g.clone()
        oa.step(grad_scale=torch.tensor([64.0]))
        ob.step()
    for p, q in zip(a, b):
        ulps_close(p.detach(), q.detach(), n=16)
    before = [p.detach().clone() for p in a], copy.deepcopy(oa.state_dict())
    for p in a:
        p.grad = torch.randn(p.shape)
    oa.step(found_inf=torch.ones(1))
    assert all(torch.equal(x, y) for x, y in zip(before[0], a))
    assert oa.state[a[0]]["step"].item() == 3
    resumed = FusedLAMB(clone_params(a), lr=1e-2)
    resumed.load_state_dict(before[1])
    assert torch.equal(resumed.state_dict()["state"][0]["exp_avg"], before[1]["state"][0]["exp_avg"])


def test_bad_input():
    p = torch.zeros(3, requires_grad=True)
    with pytest.raises(ValueError, match="amsgrad"):
        FusedLAMB([p], amsgrad=True)
    with pytest.raises(ValueError, match="betas"):
        FusedLAMB([p], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="reduced_precision_dtype"):
        FusedMixedPrecisionLamb([p], reduced_precision_dtype=torch.int8)


def test_clipping_uses_the_constructor_max_grad_norm_as_apex():
    # Apex reads self.defaults['max_grad_norm'] (one global norm, one limit): a group's
    # own value, here group 0's 0.0, neither turns clipping off nor changes the limit.
    a, b = make_params(sizes=(4, 9)), None
    b = clone_params(a)
    opt = FusedLAMB([{"params": a[:1], "max_grad_norm": 0.0}, {"params": a[1:]}], lr=1.0, weight_decay=0.0)
    ref = FusedLAMB([{"params": b[:1]}, {"params": b[1:]}], lr=1.0, weight_decay=0.0)
    for x, y in zip(a, b):
        x.grad = torch.full(x.shape, 10.0)
        y.grad = x.grad.clone()
    opt.step()
    ref.step()
    assert opt.last_grad_norm is not None and opt.last_grad_norm.item() == pytest.approx(10 * 13 ** 0.5)
    for x, y in zip(a, b):
        assert torch.equal(x.detach(), y.detach())


def test_mixed_precision_lamb_starts_from_the_given_step():
    # Apex's FusedMixedPrecisionLamb(step=N): bias correction continues from step N.
    ours = make_params(torch.bfloat16, sizes=(30, 7))
    theirs = clone_params(ours)
    opt = FusedMixedPrecisionLamb(ours, lr=1e-2, step=100, reduced_precision_dtype=torch.bfloat16)
    ref = FusedMixedPrecisionLamb(theirs, lr=1e-2, reduced_precision_dtype=torch.bfloat16)
    for p in theirs:  # the same start, by hand: a skipped step makes the state, then step 100
        p.grad = torch.zeros_like(p)
    ref.step(found_inf=torch.ones(1))
    for p in theirs:
        ref.state[p]["step"].fill_(100)
    run(opt, ours, steps=3)
    run(ref, theirs, steps=3)
    for p, q in zip(ours, theirs):
        assert opt.state[p]["step"].item() == 103
        assert torch.equal(opt.state[p]["master_param"], ref.state[q]["master_param"])
    with pytest.raises(ValueError, match="step must be >= 0"):
        FusedMixedPrecisionLamb(ours, step=-1)


def test_mixed_precision_lamb_checks_the_dtype_of_added_groups():
    opt = FusedMixedPrecisionLamb(make_params(torch.bfloat16, sizes=(3,)), reduced_precision_dtype=torch.bfloat16)
    for dtype in (torch.float16, torch.float64):
        with pytest.raises(ValueError, match=r"param group 1: params\[0\] has dtype .*reduced_precision_dtype"):
            opt.add_param_group({"params": make_params(dtype, sizes=(2,))})
        assert len(opt.param_groups) == 1
    opt.add_param_group({"params": make_params(torch.float32, sizes=(2,))})
    opt.add_param_group({"params": make_params(torch.bfloat16, sizes=(2,))})
    assert len(opt.param_groups) == 3
