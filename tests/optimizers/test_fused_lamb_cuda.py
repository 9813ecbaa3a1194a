"""FusedLAMB's CUDA kernels (fused_lamb_stage1_ / fused_lamb_stage2_, GPU machines
only) against the native CPU kernels: numerics over 20 steps (fp32, and bf16 with
master weights), found_inf (steps included) and grad_scale read on the device, the
per-tensor norms read by stage 2 on the device (trust ratio, zero norms included),
channels_last memory, no host sync.

Tolerances: Note [CUDA optimizer tolerances] in test_fused_adam_cuda.py. The CUDA
kernel runs the CPU kernel's math (core_ops/lamb_math.h) with the same roundings, but
the per-tensor norms between the stages are summed in another order on the GPU (multi_tensor_l2norm),
moving each per-tensor coefficient by a few ulps. A param then moves by about one
ulp of its value per step, with a random sign (in float32 ulps of the largest
|expected|): 12 against the CPU kernel, 8 for the moments.
"""

import pytest
import torch
from cuda_cases import _both_native  # noqa: F401  (autouse: both native libraries loaded)
from cuda_cases import STEPS, make_grads, make_params, run, ulps_close

import core_ops  # noqa: F401  (registers the ops)
from core_ops._library import op
from core_ops.optimizers import FusedLAMB

pytestmark = pytest.mark.gpu

CPU_ULPS, STATE_ULPS = 12, 8


CASES = {
    "adamw": dict(lr=1e-2, weight_decay=0.05),
    "l2": dict(lr=1e-2, weight_decay=0.05, adam_w_mode=False, max_grad_norm=0.0),
    "nvlamb_no_wd": dict(lr=1e-2, weight_decay=0.0, use_nvlamb=True, grad_averaging=False),
    "no_wd_no_bc": dict(lr=1e-2, weight_decay=0.0, bias_correction=False),
    "maximize": dict(lr=1e-2, weight_decay=0.01, maximize=True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fp32_matches_cpu_kernel(case):
    kw = CASES[case]
    gpu, cpu = make_params("cuda"), make_params("cpu")
    opt_gpu, opt_cpu = FusedLAMB(gpu, **kw), FusedLAMB(cpu, **kw)
    grads = make_grads()
    run(opt_gpu, gpu, grads)
    run(opt_cpu, cpu, grads)
    for a, c in zip(gpu, cpu):
        ulps_close(a, c, CPU_ULPS)
        for key in ("exp_avg", "exp_avg_sq"):
            ulps_close(opt_gpu.state[a][key], opt_cpu.state[c][key], STATE_ULPS)
        assert opt_gpu.state[a]["step"].device == a.device
        assert opt_gpu.state[a]["step"].item() == opt_cpu.state[c]["step"].item() == STEPS


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_master_weights_match_cpu_kernel(dtype):
    kw = dict(lr=1e-2, weight_decay=0.01)
    gpu, cpu = make_params("cuda", dtype), make_params("cpu", dtype)
    opt_gpu = FusedLAMB(gpu, master_weights=True, **kw)
    opt_cpu = FusedLAMB(cpu, master_weights=True, **kw)
    grads = make_grads(dtype=dtype)
    run(opt_gpu, gpu, grads)
    run(opt_cpu, cpu, grads)
    for a, c in zip(gpu, cpu):
        master = opt_gpu.state[a]["master_param"]
        assert master.dtype == torch.float32 and master.device == a.device
        ulps_close(master, opt_cpu.state[c]["master_param"], CPU_ULPS)
        assert torch.equal(a.detach(), master.to(dtype))  # the param is the master, rounded
        ulps_close(opt_gpu.state[a]["exp_avg_sq"], opt_cpu.state[c]["exp_avg_sq"], STATE_ULPS)
        assert opt_gpu.state[a]["step"].item() == STEPS


def stage2_lists(device, seed=0):
    """fused_lamb_stage2_'s lists for bf16 params with masters: many small tensors,
    one over several chunks, one channels_last; norms with zeros (ratio 1)."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(1 + (i * 37) % 300,) for i in range(300)] + [(3 * 65536 + 7,), (2, 3, 5, 7)]
    lists = {k: [] for k in ("params", "masters", "updates")}

    def place(t):
        t = t.to(device)
        return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t

    for shape in shapes:
        p = torch.randn(shape, generator=g)
        lists["params"].append(place(p.to(torch.bfloat16)))
        lists["masters"].append(place(p.clone()))
        lists["updates"].append(place(torch.randn(shape, generator=g)))
    n = len(shapes)
    pn, un = torch.rand(n, generator=g) + 0.5, torch.rand(n, generator=g) + 0.5
    pn[::7], un[::11] = 0.0, 0.0
    lists["param_norms"], lists["update_norms"] = pn.to(device), un.to(device)
    return lists


@pytest.mark.parametrize("weight_decay,use_nvlamb", [(0.01, False), (0.0, False), (0.0, True)])
def test_stage2_reads_norms_on_the_device(weight_decay, use_nvlamb):
    gpu, cpu = stage2_lists("cuda"), stage2_lists("cpu")
    for lists, device in ((gpu, "cuda"), (cpu, "cpu")):
        for _ in range(2):
            op("fused_lamb_stage2_")(lists["params"], lists["masters"], lists["updates"], lists["param_norms"],
                                     lists["update_norms"], 1e-3, weight_decay, use_nvlamb,
                                     torch.tensor([2e-2], dtype=torch.float64, device=device),
                                     torch.zeros(1, dtype=torch.int32, device=device))
    flat = lambda ts: torch.cat([t.detach().reshape(-1).cpu() for t in ts])  # noqa: E731
    assert all(a.stride() == c.stride() for a, c in zip(gpu["masters"], cpu["masters"]))
    ulps_close(flat(gpu["masters"]), flat(cpu["masters"]), 2)  # one fused multiply-add a step
    for a, m in zip(gpu["params"], gpu["masters"]):
        assert torch.equal(a, m.to(torch.bfloat16))


def test_no_host_sync():
    l2 = stage2_lists("cuda")
    ps = [m.clone() for m in l2["masters"]]
    gs = [torch.randn_like(p) for p in ps]
    state = [[torch.zeros_like(p) for p in ps] for _ in range(3)]  # exp_avgs, exp_avg_sqs, updates
    steps = [torch.zeros((), device="cuda") for _ in ps]
    scale, flag, lr = torch.ones(1, device="cuda"), torch.zeros(1, device="cuda"), torch.full((1,), 1e-2, device="cuda")
    torch.cuda.set_sync_debug_mode("error")  # any synchronizing call in the ops raises
    try:
        op("fused_lamb_stage1_")(ps, gs, state[0], state[1], [], steps, state[2], 0.9, 0.999, 1e-6, 0.01,
                                 True, True, True, False, scale, flag)
        op("fused_lamb_stage2_")(l2["params"], l2["masters"], l2["updates"], l2["param_norms"],
                                 l2["update_norms"], 1e-2, 0.01, False, lr, flag)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert all(s.item() == 1 for s in steps)
