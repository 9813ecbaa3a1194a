"""FusedSGD's CUDA kernel (GPU machines only) against the native CPU kernel and
torch.optim.SGD on CUDA: numerics over 20 steps (fp32, and bf16 with master
weights), found_inf and grad_scale read on the device, channels_last memory, no host
sync.

Tolerances: Note [CUDA optimizer tolerances] in test_fused_adam_cuda.py. The CUDA
kernel runs the CPU kernel's math (core_ops/sgd_math.h) with the same roundings, so
the two agree bit for bit (CPU_ULPS = 0). Against torch.optim.SGD (which
rounds its own way: add with alpha, mul_ then add_): at most one rounding of a value per step with a random
sign, the same budgets as Adam's (in float32 ulps of the largest |expected|): 20 for
params, 8 for the state.
"""

import pytest
import torch
from cuda_cases import _both_native  # noqa: F401  (autouse: both native libraries loaded)
from cuda_cases import make_grads, make_params, run, ulps_close

import core_ops  # noqa: F401  (registers the ops)
from core_ops._library import op
from core_ops.optimizers import FusedSGD

pytestmark = pytest.mark.gpu

CPU_ULPS, TORCH_ULPS, STATE_ULPS = 0, 20, 8


CASES = {
    "plain": dict(lr=1e-2),
    "wd": dict(lr=1e-2, weight_decay=0.05),
    "momentum": dict(lr=1e-2, momentum=0.9, dampening=0.1, weight_decay=0.05),
    "nesterov": dict(lr=1e-2, momentum=0.9, nesterov=True, weight_decay=0.05),
    "maximize": dict(lr=1e-2, momentum=0.8, weight_decay=0.01, maximize=True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fp32_matches_cpu_kernel_and_torch(case):
    kw = CASES[case]
    gpu, cpu, ref = make_params("cuda"), make_params("cpu"), make_params("cuda")
    opt_gpu, opt_cpu = FusedSGD(gpu, **kw), FusedSGD(cpu, **kw)
    opt_ref = torch.optim.SGD(ref, **kw)
    grads = make_grads()
    for opt, ps in ((opt_gpu, gpu), (opt_cpu, cpu), (opt_ref, ref)):
        run(opt, ps, grads)
    for a, c, r in zip(gpu, cpu, ref):
        ulps_close(a, c, CPU_ULPS)
        ulps_close(a, r, TORCH_ULPS)
        if kw.get("momentum"):
            ulps_close(opt_gpu.state[a]["momentum_buffer"], opt_cpu.state[c]["momentum_buffer"], CPU_ULPS)
            ulps_close(opt_gpu.state[a]["momentum_buffer"], opt_ref.state[r]["momentum_buffer"], STATE_ULPS)


def test_wd_after_momentum_matches_cpu_kernel():
    kw = dict(lr=1e-2, momentum=0.9, weight_decay=0.05, wd_after_momentum=True)
    gpu, cpu = make_params("cuda"), make_params("cpu")
    opt_gpu, opt_cpu = FusedSGD(gpu, **kw), FusedSGD(cpu, **kw)
    grads = make_grads()
    run(opt_gpu, gpu, grads)
    run(opt_cpu, cpu, grads)
    for a, c in zip(gpu, cpu):
        ulps_close(a, c, CPU_ULPS)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_master_weights_follow_the_fp32_run(dtype):
    kw = dict(lr=1e-2, momentum=0.9, weight_decay=0.01)
    gpu, cpu = make_params("cuda", dtype), make_params("cpu", dtype)
    fp32 = [p.detach().float().requires_grad_() for p in make_params("cuda", dtype)]  # the same rounded start
    opt_gpu = FusedSGD(gpu, master_weights=True, **kw)
    opt_cpu = FusedSGD(cpu, master_weights=True, **kw)
    opt_ref = torch.optim.SGD(fp32, **kw)
    grads = make_grads(dtype=dtype)  # rounded to the param dtype once; fp32 torch is fed the same values
    run(opt_gpu, gpu, grads)
    run(opt_cpu, cpu, grads)
    run(opt_ref, fp32, grads, dtype=torch.float32)
    for a, c, r in zip(gpu, cpu, fp32):
        master = opt_gpu.state[a]["master_param"]
        assert master.dtype == torch.float32 and master.device == a.device
        ulps_close(master, opt_cpu.state[c]["master_param"], CPU_ULPS)
        ulps_close(master, r, TORCH_ULPS)
        assert torch.equal(a.detach(), master.to(dtype))  # the param is the master, rounded
        ulps_close(opt_gpu.state[a]["momentum_buffer"], opt_cpu.state[c]["momentum_buffer"], CPU_ULPS)


def op_lists(device, seed=0):
    """fused_sgd_'s lists for bf16 params with momentum and masters: small tensors,
    one over several chunks, one channels_last."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(1 + (i * 37) % 300,) for i in range(300)] + [(3 * 65536 + 7,), (2, 3, 5, 7)]
    lists = {k: [] for k in ("params", "grads", "bufs", "masters")}

    def place(t):
        t = t.to(device)
        return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t

    for shape in shapes:
        p = torch.randn(shape, generator=g)
        lists["params"].append(place(p.to(torch.bfloat16)))
        lists["masters"].append(place(p.clone()))
        lists["grads"].append(torch.randn(shape, generator=g).to(torch.bfloat16).to(device))
        lists["bufs"].append(place(torch.randn(shape, generator=g) * 0.1))
    return lists


def call_op(lists, first_step=False, **kw):
    op("fused_sgd_")(lists["params"], lists["grads"], lists["bufs"], lists["masters"], 1e-2, 0.9, 0.0,
                     0.01, True, False, first_step, False, kw.get("lr_tensor"), kw.get("grad_scale"),
                     kw.get("found_inf"))


def test_many_tensors_channels_last_lr_tensor_match_cpu():
    gpu, cpu = op_lists("cuda"), op_lists("cpu")
    for lists, device in ((gpu, "cuda"), (cpu, "cpu")):
        for i in range(3):
            call_op(lists, first_step=i == 0, lr_tensor=torch.tensor([2e-2], dtype=torch.float64, device=device),
                    grad_scale=torch.tensor([3.0], device=device),
                    found_inf=torch.zeros(1, dtype=torch.int32, device=device))
    flat = lambda ts: torch.cat([t.detach().reshape(-1).cpu() for t in ts])  # noqa: E731
    for key in ("masters", "bufs"):
        assert all(a.stride() == c.stride() for a, c in zip(gpu[key], cpu[key]))
        ulps_close(flat(gpu[key]), flat(cpu[key]), CPU_ULPS)
    for a, m in zip(gpu["params"], gpu["masters"]):
        assert torch.equal(a, m.to(torch.bfloat16))


def test_no_host_sync():
    lists = op_lists("cuda")
    torch.cuda.set_sync_debug_mode("error")  # any synchronizing call in the op raises
    try:
        call_op(lists, grad_scale=torch.ones(1, device="cuda"), found_inf=torch.zeros(1, device="cuda"),
                lr_tensor=torch.full((1,), 1e-2, device="cuda"))
    finally:
        torch.cuda.set_sync_debug_mode(0)
