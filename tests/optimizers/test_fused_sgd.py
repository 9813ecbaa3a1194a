"""FusedSGD against torch.optim.SGD on each device (the CPU in float32 and float64, a
GPU in float32), each device's kernel against the ones below it (on the CPU the
reference kernel, on a GPU the CPU's), Apex's wd_after_momentum, half params without
masters as torch steps them, state dicts that interoperate with torch's, and on a GPU
many tensors, channels_last memory, no host sync. What every fused optimizer shares:
the generic tests of optimizer_registry.py.

Tolerances: against torch.optim, optim_cases.TORCH_ULPS; against the kernels below, the
registry entry's (the CUDA kernel runs the CPU kernel's math, core_ops/sgd_math.h, with
the same roundings: bit for bit)."""

import pytest
import torch
from optim_cases import (DEVICES, assert_like_the_kernels_below, assert_lists_match, assert_no_host_sync,
                         assert_runs_as_torch, assert_same_run, assert_state_dict_round_trip, make_params, many_shapes,
                         op_on_gpu_and_cpu, place, torch_cases, ulps_close)
from optim_cases import native_kernels  # noqa: F401  (autouse)
from optimizer_registry import OPTIMIZERS

import core_ops.optimizers.fused_sgd
from core_ops._schemas import op
from core_ops.optimizers import FusedSGD

SGD_CASES = [dict(), dict(momentum=0.9), dict(momentum=0.9, dampening=0.3, weight_decay=0.01),
             dict(momentum=0.9, nesterov=True, weight_decay=0.01), dict(weight_decay=0.1),
             dict(momentum=0.5, maximize=True)]
# On a GPU (torch's CUDA kernels round their own way: TORCH_ULPS["cuda"]).
CUDA_CASES = {
    "plain": dict(lr=1e-2),
    "wd": dict(lr=1e-2, weight_decay=0.05),
    "momentum": dict(lr=1e-2, momentum=0.9, dampening=0.1, weight_decay=0.05),
    "nesterov": dict(lr=1e-2, momentum=0.9, nesterov=True, weight_decay=0.05),
    "maximize": dict(lr=1e-2, momentum=0.8, weight_decay=0.01, maximize=True),
}


@pytest.mark.parametrize("device,kw,dtype", torch_cases([dict(lr=0.05, **kw) for kw in SGD_CASES],
                                                        CUDA_CASES.values()))
def test_matches_torch(device, kw, dtype):
    assert_runs_as_torch(device, dtype, lambda ps: FusedSGD(ps, **kw), lambda ps: torch.optim.SGD(ps, **kw),
                         ["momentum_buffer"] if kw.get("momentum") else [])


def test_sgd_fused_baseline_too():
    kw = dict(lr=0.05, momentum=0.9, weight_decay=0.01)
    assert_same_run(lambda p: FusedSGD(p, **kw), lambda p: torch.optim.SGD(p, fused=True, **kw))


@pytest.mark.parametrize("case", [*CUDA_CASES, "wd_after_momentum"])
@pytest.mark.parametrize("device", DEVICES)
def test_fp32_matches_the_kernels_below(device, case, monkeypatch):
    kw = CUDA_CASES.get(case, dict(lr=1e-2, momentum=0.9, weight_decay=0.05, wd_after_momentum=True))
    info = OPTIMIZERS["sgd"]
    tolerance = (info.across_devices if device != "cpu" else info.against_reference).ulps
    assert_like_the_kernels_below(device, monkeypatch, lambda ps: FusedSGD(ps, **kw), [core_ops.optimizers.fused_sgd],
                                  tolerance, tolerance)


def test_wd_after_momentum_matches_reference_formula():
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


def test_state_dicts_interoperate_with_torch():
    assert_state_dict_round_trip(lambda p: FusedSGD(p, lr=0.1, momentum=0.9),
                                 lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))


def test_bad_input():
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


# ---- the op on a GPU: many tensors, odd memory, no host sync ----------------------

def op_lists(device, seed=0):
    """fused_sgd_'s lists for bf16 params with momentum and masters (optim_cases.many_shapes)."""
    g = torch.Generator().manual_seed(seed)
    lists = {k: [] for k in ("params", "grads", "bufs", "masters")}
    for shape in many_shapes():
        p = torch.randn(shape, generator=g)
        lists["params"].append(place(p.to(torch.bfloat16), device))
        lists["masters"].append(place(p.clone(), device))
        lists["grads"].append(torch.randn(shape, generator=g).to(torch.bfloat16).to(device))
        lists["bufs"].append(place(torch.randn(shape, generator=g) * 0.1, device))
    return lists


def call_op(lists, first_step=False, **kw):
    op("fused_sgd_")(lists["params"], lists["grads"], lists["bufs"], lists["masters"], 1e-2, 0.9, 0.0,
                     0.01, True, False, first_step, False, kw.get("lr_tensor"), kw.get("grad_scale"),
                     kw.get("found_inf"))


@pytest.mark.gpu
def test_many_tensors_channels_last_lr_tensor_match_cpu():
    gpu, cpu = op_on_gpu_and_cpu(op_lists, lambda lists, i, **kw: call_op(lists, first_step=i == 0, **kw))
    assert_lists_match(gpu, cpu, {"masters": 0, "bufs": 0})


@pytest.mark.gpu
def test_no_host_sync():
    assert_no_host_sync(op_lists("cuda"), call_op)


def test_opcheck(device):
    """fused_sgd_'s schema, fake kernel and dispatch (torch.library.opcheck)."""
    ts = [torch.randn(n, device=device) for n in (3, 17, 16385)]
    flag = torch.zeros(1, device=device)
    torch.library.opcheck(torch.ops.core_ops.fused_sgd_.default,
        ([t.clone() for t in ts], [torch.randn_like(t) for t in ts],
         [torch.zeros_like(t) for t in ts], [], 1e-2, 0.9, 0.0, 0.01, True, False, False,
         False, None, None, flag.clone()))
