"""FusedLAMB against LAMB written from the paper (You et al. 2019, Algorithm 2, with
Apex's options) in float64; each device's kernels against the ones below them (on the
CPU the reference kernels, on a GPU the CPU's: fused_lamb_stage1_ / fused_lamb_stage2_,
GPU machines only), master weights, FusedMixedPrecisionLamb, clipping, and on a GPU
many tensors, channels_last memory, no host sync. What every fused optimizer shares:
the generic tests of optimizer_registry.py.

Tolerances: float64 runs agree with the paper to 1e-12 (same operations, different
order). Against the kernels below, in float32 ulps of the largest |expected| after the
run (BELOW): the fp32 native kernel and the reference kernel round the same operations
the same way but for the norms, which torch sums in its own order: 8 (Note [Optimizer
tolerances]). The CUDA kernel runs the CPU kernel's math (core_ops/lamb_math.h) with the
same roundings, but the per-tensor norms between the stages are summed in another order
on the GPU (multi_tensor_l2norm), moving each per-tensor coefficient by a few ulps; a
param then moves by about one ulp of its value per step, with a random sign: 12 against
the CPU kernel, 8 for the moments (Note [CUDA optimizer tolerances] in test_fused_adam.py).
"""

import copy

import pytest
import torch
from optim_cases import (DEVICE_SIZES, DEVICES, STEPS, assert_like_the_kernels_below, clone_params, flat, make_grads,
                         make_params, many_shapes, no_host_sync, place, run, ulps_close)
from optim_cases import native_kernels  # noqa: F401  (autouse)

import core_ops.optimizers.fused_lamb
from core_ops._schemas import op
from core_ops.multi_tensor_apply import ops
from core_ops.optimizers import FusedLAMB, FusedMixedPrecisionLamb

# The kernels below each device's: (sizes, steps, ulps of a param, ulps of a moment).
BELOW = {"cpu": ((16385, 33), 10, 8, 8), "cuda": (DEVICE_SIZES, STEPS, 12, 8)}


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


CASES = {
    "adamw": dict(lr=1e-2, weight_decay=0.05),
    "l2": dict(lr=1e-2, weight_decay=0.05, adam_w_mode=False, max_grad_norm=0.0),
    "nvlamb_no_wd": dict(lr=1e-2, weight_decay=0.0, use_nvlamb=True, grad_averaging=False),
    "no_wd_no_bc": dict(lr=1e-2, weight_decay=0.0, bias_correction=False),
    "maximize": dict(lr=1e-2, weight_decay=0.01, maximize=True),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("device", DEVICES)
def test_fp32_matches_the_kernels_below(device, case, monkeypatch):
    kw = CASES[case]
    sizes, steps, param_ulps, state_ulps = BELOW[device]
    opt, ours = assert_like_the_kernels_below(device, monkeypatch, lambda ps: FusedLAMB(ps, **kw),
                                              [core_ops.optimizers.fused_lamb, ops], param_ulps, state_ulps,
                                              sizes=sizes, steps=steps)
    assert all(opt.state[p]["step"].item() == steps for p in ours)


@pytest.mark.parametrize("mixed", [False, True], ids=["fp32", "bf16_masters"])
def test_cpu_batches_change_no_result(mixed, monkeypatch):
    # Note [LAMB in batches on the CPU]: batches of 300 elements (one tensor larger
    # than a batch, a channels_last one, a step where a param has no grad so the
    # batches change) give bit for bit the results of one batch, and keep one buffer,
    # of the largest batch.
    shapes = [(7, 11), (257,), (40, 30), (5,), (2, 3, 4, 5), (33,)]
    dtype = torch.bfloat16 if mixed else torch.float32
    make = (lambda ps: FusedMixedPrecisionLamb(ps, lr=1e-2, reduced_precision_dtype=dtype)) if mixed else \
        (lambda ps: FusedLAMB(ps, lr=1e-2))
    runs = {}
    for batch in (300, 1 << 20):
        monkeypatch.setattr(core_ops.optimizers.fused_lamb, "_BATCH", batch)
        g = torch.Generator().manual_seed(0)
        ps = [torch.randn(s, generator=g).to(dtype).requires_grad_() for s in shapes]
        ps[4].data = ps[4].data.contiguous(memory_format=torch.channels_last)
        opt = make(ps)
        for step in range(4):
            for i, p in enumerate(ps):
                p.grad = None if (step == 2 and i == 1) else torch.randn(p.shape, generator=g).to(dtype)
            opt.step()
        runs[batch] = ps, opt
    (ps, opt), (whole, one) = runs[300], runs[1 << 20]
    assert opt._update_buffer.numel() == 1200  # the largest tensor, a batch of its own
    for p, q in zip(ps, whole):
        assert torch.equal(p, q)
        for key in ("exp_avg", "exp_avg_sq", *(["master_param"] if mixed else [])):
            assert torch.equal(opt.state[p][key], one.state[q][key]), key
    assert ps[4].is_contiguous(memory_format=torch.channels_last)


def test_cpu_batches_keep_a_bounded_set_of_views():
    # Params whose grads come and go give a new batch layout most steps; the views
    # kept for them stay bounded instead of growing with every layout seen.
    ps = [torch.randn(i + 1, requires_grad=True) for i in range(12)]
    opt = FusedLAMB(ps, lr=1e-2)
    for step in range(100):  # step 0: every param (the buffer at its largest)
        for i, p in enumerate(ps):
            p.grad = torch.ones(i + 1) if (step >> (i % 7)) & 1 or i == 0 or step == 0 else None
        opt.step()
    assert 0 < len(opt._update_views) <= 64  # core_ops.optimizers.fused_lamb._KEPT_LAYOUTS; 100 unbounded


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


def test_mixed_precision_lamb_takes_maximize_and_skip_nonfinite():
    """As every fused optimizer (Apex's took neither): maximize steps as FusedLAMB's on
    the masters, and skip_nonfinite skips a step with a nan grad, counted."""
    ours = make_params(torch.bfloat16, sizes=(300, 17))
    fp32 = clone_params(ours, torch.float32)
    opt = FusedMixedPrecisionLamb(ours, lr=1e-2, maximize=True, skip_nonfinite=True)
    ref = FusedLAMB(fp32, lr=1e-2, maximize=True)
    grads = make_grads(sizes=(300, 17), steps=4, dtype=torch.bfloat16)
    run(opt, ours, grads)
    run(ref, fp32, grads, dtype=torch.float32)
    for a, b in zip(ours, fp32):
        assert torch.equal(opt.state[a]["master_param"], b.detach())
    assert opt.param_groups[0]["maximize"] is True
    ours[1].grad[3] = float("nan")
    before = [opt.state[p]["master_param"].clone() for p in ours]
    opt.step()
    assert opt.skipped_steps == 1
    assert all(torch.equal(m, opt.state[p]["master_param"]) for m, p in zip(before, ours))


def test_mixed_precision_lamb_checks_the_dtype_of_added_groups():
    opt = FusedMixedPrecisionLamb(make_params(torch.bfloat16, sizes=(3,)), reduced_precision_dtype=torch.bfloat16)
    for dtype in (torch.float16, torch.float64):
        with pytest.raises(ValueError, match=r"param group 1: params\[0\] has dtype .*reduced_precision_dtype"):
            opt.add_param_group({"params": make_params(dtype, sizes=(2,))})
        assert len(opt.param_groups) == 1
    opt.add_param_group({"params": make_params(torch.float32, sizes=(2,))})
    opt.add_param_group({"params": make_params(torch.bfloat16, sizes=(2,))})
    assert len(opt.param_groups) == 3


@pytest.mark.inductor_cpu
@pytest.mark.parametrize("scaler", ["torch.amp.GradScaler", "LossScaler"])
def test_compiled_scaler_step_with_clipping_matches_eager(scaler):
    """torch.compile of scaler.step(opt) where the step clips by global norm (FusedLAMB's
    default): the overflow report to torch's GradScaler walks the stack (Note
    [Overflowing norms]), which broke the compiled step, so it is skipped when compiling;
    the norm is kept without setting an attribute, which broke it on torch 2.6."""
    from core_ops.amp import LossScaler

    def train(compiled):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        opt = FusedLAMB(model.parameters(), lr=0.01)
        s = (torch.amp.GradScaler("cpu", init_scale=128.0) if scaler.startswith("torch")
             else LossScaler("cpu", init_scale=128.0))

        def step():
            s.step(opt)
            s.update()

        step = torch.compile(step) if compiled else step
        x, y = torch.randn(8, 4), torch.randn(8, 2)
        for _ in range(2):
            opt.zero_grad()
            s.scale(((model(x) - y) ** 2).mean()).backward()
            step()
        return [p.detach() for p in model.parameters()] + [opt.last_grad_norm]

    for a, b in zip(train(True), train(False)):  # the params, then the norm kept
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


# ---- the ops on a GPU: many tensors, odd memory, no host sync ---------------------

def stage2_lists(device, seed=0):
    """fused_lamb_stage2_'s lists for bf16 params with masters (optim_cases.many_shapes);
    norms with zeros (ratio 1)."""
    g = torch.Generator().manual_seed(seed)
    shapes = many_shapes()
    lists = {k: [] for k in ("params", "masters", "updates")}
    for shape in shapes:
        p = torch.randn(shape, generator=g)
        lists["params"].append(place(p.to(torch.bfloat16), device))
        lists["masters"].append(place(p.clone(), device))
        lists["updates"].append(place(torch.randn(shape, generator=g), device))
    n = len(shapes)
    pn, un = torch.rand(n, generator=g) + 0.5, torch.rand(n, generator=g) + 0.5
    pn[::7], un[::11] = 0.0, 0.0
    lists["param_norms"], lists["update_norms"] = pn.to(device), un.to(device)
    return lists


@pytest.mark.gpu
@pytest.mark.parametrize("weight_decay,use_nvlamb", [(0.01, False), (0.0, False), (0.0, True)])
def test_stage2_reads_norms_on_the_device(weight_decay, use_nvlamb):
    gpu, cpu = stage2_lists("cuda"), stage2_lists("cpu")
    for lists, device in ((gpu, "cuda"), (cpu, "cpu")):
        for _ in range(2):
            op("fused_lamb_stage2_")(lists["params"], lists["masters"], lists["updates"], lists["param_norms"],
                                     lists["update_norms"], 1e-3, weight_decay, use_nvlamb,
                                     torch.tensor([2e-2], dtype=torch.float64, device=device),
                                     torch.zeros(1, dtype=torch.int32, device=device))
    assert all(a.stride() == c.stride() for a, c in zip(gpu["masters"], cpu["masters"]))
    ulps_close(flat(gpu["masters"]), flat(cpu["masters"]), 2)  # one fused multiply-add a step
    for a, m in zip(gpu["params"], gpu["masters"]):
        assert torch.equal(a, m.to(torch.bfloat16))


@pytest.mark.gpu
def test_no_host_sync():
    l2 = stage2_lists("cuda")
    ps = [m.clone() for m in l2["masters"]]
    gs = [torch.randn_like(p) for p in ps]
    state = [[torch.zeros_like(p) for p in ps] for _ in range(3)]  # exp_avgs, exp_avg_sqs, updates
    steps = [torch.zeros((), device="cuda") for _ in ps]
    scale, flag, lr = torch.ones(1, device="cuda"), torch.zeros(1, device="cuda"), torch.full((1,), 1e-2, device="cuda")
    with no_host_sync():
        op("fused_lamb_stage1_")(ps, gs, state[0], state[1], [], steps, state[2], 0.9, 0.999, 1e-6, 0.01,
                                 True, True, True, False, scale, flag)
        op("fused_lamb_stage2_")(l2["params"], l2["masters"], l2["updates"], l2["param_norms"],
                                 l2["update_norms"], 1e-2, 0.01, False, lr, flag)
    assert all(s.item() == 1 for s in steps)
