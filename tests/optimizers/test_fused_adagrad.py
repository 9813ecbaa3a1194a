"""FusedAdagrad against torch.optim.Adagrad on each device (the CPU in float32 and
float64, a GPU in float32: the sums and step counts too, kept on the params' device),
each device's kernel against the ones below it (on the CPU the reference kernel, on a
GPU the CPU's), Apex's adagrad_w_mode, state dicts that interoperate with torch's, and
on a GPU many tensors, channels_last memory, no host sync. What every fused optimizer
shares: the generic tests of optimizer_registry.py.

Tolerances: against torch.optim, optim_cases.TORCH_ULPS (torch rounds its own way:
addcmul_, sqrt().add_(eps), addcdiv_); against the kernels below, the registry entry's
(the CUDA kernel runs the CPU kernel's math, core_ops/adagrad_math.h, with the same
roundings: bit for bit)."""

import pytest
import torch
from optim_cases import (DEVICES, assert_like_the_kernels_below, assert_lists_match, assert_no_host_sync,
                         assert_runs_as_torch, assert_state_dict_round_trip, make_params, many_shapes,
                         op_on_gpu_and_cpu, place, torch_cases, ulps_close)
from optim_cases import native_kernels  # noqa: F401  (autouse)
from optimizer_registry import OPTIMIZERS

import core_ops.optimizers.fused_adagrad
from core_ops._schemas import op
from core_ops.optimizers import FusedAdagrad

CPU_CASES = [dict(lr=0.05), dict(lr=0.05, weight_decay=0.01),
             dict(lr=0.05, lr_decay=0.05, initial_accumulator_value=0.2), dict(lr=0.05, maximize=True, eps=1e-6)]
CUDA_CASES = {
    "plain": dict(lr=1e-2),
    "wd_lr_decay": dict(lr=1e-2, weight_decay=0.05, lr_decay=0.01, eps=1e-6),
    "init_acc": dict(lr=1e-2, initial_accumulator_value=0.1),
    "maximize": dict(lr=1e-2, weight_decay=0.01, maximize=True),
}


@pytest.mark.parametrize("device,kw,dtype", torch_cases(CPU_CASES, CUDA_CASES.values()))
def test_matches_torch(device, kw, dtype):
    assert_runs_as_torch(device, dtype, lambda ps: FusedAdagrad(ps, **kw), lambda ps: torch.optim.Adagrad(ps, **kw),
                         ["sum"])


@pytest.mark.parametrize("case", [*CUDA_CASES, "adagrad_w_mode"])
@pytest.mark.parametrize("device", DEVICES)
def test_fp32_matches_the_kernels_below(device, case, monkeypatch):
    kw = CUDA_CASES.get(case, dict(lr=1e-2, weight_decay=0.05, adagrad_w_mode=True, lr_decay=0.01))
    info = OPTIMIZERS["adagrad"]
    tolerance = (info.across_devices if device != "cpu" else info.against_reference).ulps
    assert_like_the_kernels_below(device, monkeypatch, lambda ps: FusedAdagrad(ps, **kw),
                                  [core_ops.optimizers.fused_adagrad], tolerance, tolerance)


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


def test_state_dicts_interoperate_with_torch():
    assert_state_dict_round_trip(lambda p: FusedAdagrad(p, lr=0.1), lambda p: torch.optim.Adagrad(p, lr=0.1))


def test_sparse_grads_are_refused():
    p = torch.zeros(3, requires_grad=True)
    opt = FusedAdagrad([p])
    p.grad = torch.zeros(3).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        opt.step()


# ---- the op on a GPU: many tensors, odd memory, no host sync ----------------------

def op_lists(device, seed=0):
    """fused_adagrad_'s lists for bf16 params with masters (optim_cases.many_shapes), step
    counts that differ per tensor."""
    g = torch.Generator().manual_seed(seed)
    lists = {k: [] for k in ("params", "grads", "sums", "masters", "steps")}
    for i, shape in enumerate(many_shapes()):
        p = torch.randn(shape, generator=g)
        lists["params"].append(place(p.to(torch.bfloat16), device))
        lists["masters"].append(place(p.clone(), device))
        lists["grads"].append(torch.randn(shape, generator=g).to(torch.bfloat16).to(device))
        lists["sums"].append(place(torch.randn(shape, generator=g).abs() * 0.1, device))
        lists["steps"].append(torch.full((), float(i % 5), device=device))
    return lists


def call_op(lists, **kw):
    op("fused_adagrad_")(lists["params"], lists["grads"], lists["sums"], lists["masters"], lists["steps"],
                         1e-2, 0.01, 1e-10, 0.01, False, False, kw.get("lr_tensor"), kw.get("grad_scale"),
                         kw.get("found_inf"))


@pytest.mark.gpu
def test_many_tensors_channels_last_lr_tensor_match_cpu():
    gpu, cpu = op_on_gpu_and_cpu(op_lists, lambda lists, i, **kw: call_op(lists, **kw))
    assert_lists_match(gpu, cpu, {"masters": 0, "sums": 0})


@pytest.mark.gpu
def test_no_host_sync():
    assert_no_host_sync(op_lists("cuda"), call_op)


def test_opcheck(device):
    """fused_adagrad_'s schema, fake kernel and dispatch (torch.library.opcheck)."""
    ts = [torch.randn(n, device=device) for n in (3, 17, 16385)]
    one = torch.ones(1, device=device)
    torch.library.opcheck(torch.ops.core_ops.fused_adagrad_.default,
        ([t.clone() for t in ts], [torch.randn_like(t) for t in ts],
         [torch.zeros_like(t) for t in ts], [], [torch.zeros((), device=device) for _ in ts],
         1e-2, 0.0, 1e-10, 0.0, False, False, one * 0.1, None, None))
