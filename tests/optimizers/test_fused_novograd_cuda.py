"""FusedNovoGrad's CUDA kernel (GPU machines only) against the native CPU kernel:
numerics over 20 steps (fp32, and bf16 with master weights), both norm types and
moment modes, init_zero, found_inf (steps and second moments included; a skipped
first step leaves the first step to come) and grad_scale read on the device (grads
and norms divided inside), the per-tensor second moments kept on the device,
channels_last memory, no host sync.

Tolerances: Note [CUDA optimizer tolerances] in test_fused_adam_cuda.py. The CUDA
kernel runs the CPU kernel's math (core_ops/novograd_math.h) with the same roundings, but
the grad norms are summed in another order on the GPU (multi_tensor_l2norm),
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
from core_ops.optimizers import FusedNovoGrad

pytestmark = pytest.mark.gpu

CPU_ULPS, STATE_ULPS = 12, 8


CASES = {
    "l2": dict(lr=5e-2, betas=(0.95, 0.98), weight_decay=0.05),
    "max": dict(lr=5e-2, betas=(0.95, 0.98), weight_decay=0.05, norm_type=0),
    "reg_inside": dict(lr=5e-2, weight_decay=0.05, reg_inside_moment=True),
    "init_zero": dict(lr=5e-2, init_zero=True, grad_averaging=False),
    "no_bc_maximize": dict(lr=5e-2, bias_correction=False, maximize=True, norm_type=0),
}


def assert_match(opt_gpu, gpu, opt_cpu, cpu, param_key=None):
    for a, c in zip(gpu, cpu):
        sa, sc = opt_gpu.state[a], opt_cpu.state[c]
        ulps_close(sa[param_key] if param_key else a, sc[param_key] if param_key else c, CPU_ULPS)
        ulps_close(sa["exp_avg"], sc["exp_avg"], STATE_ULPS)
        assert sa["exp_avg_sq"].device == a.device and sa["exp_avg_sq"].numel() == 1
        ulps_close(sa["exp_avg_sq"], sc["exp_avg_sq"], STATE_ULPS)
        assert sa["step"].device == a.device
        assert sa["step"].item() == sc["step"].item()


@pytest.mark.parametrize("case", list(CASES))
def test_fp32_matches_cpu_kernel(case):
    kw = CASES[case]
    gpu, cpu = make_params("cuda"), make_params("cpu")
    opt_gpu, opt_cpu = FusedNovoGrad(gpu, **kw), FusedNovoGrad(cpu, **kw)
    grads = make_grads()
    run(opt_gpu, gpu, grads)
    run(opt_cpu, cpu, grads)
    assert_match(opt_gpu, gpu, opt_cpu, cpu)
    assert all(opt_gpu.state[p]["step"].item() == STEPS for p in gpu)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("norm_type", [2, 0])
def test_master_weights_match_cpu_kernel(dtype, norm_type):
    kw = dict(lr=5e-2, weight_decay=0.01, norm_type=norm_type)
    gpu, cpu = make_params("cuda", dtype), make_params("cpu", dtype)
    opt_gpu = FusedNovoGrad(gpu, master_weights=True, **kw)
    opt_cpu = FusedNovoGrad(cpu, master_weights=True, **kw)
    grads = make_grads(dtype=dtype)
    run(opt_gpu, gpu, grads)
    run(opt_cpu, cpu, grads)
    assert_match(opt_gpu, gpu, opt_cpu, cpu, param_key="master_param")
    for a in gpu:
        master = opt_gpu.state[a]["master_param"]
        assert master.dtype == torch.float32 and master.device == a.device
        assert torch.equal(a.detach(), master.to(dtype))  # the param is the master, rounded


def test_a_skipped_first_step_leaves_the_first_step_to_come():
    """Not even the fresh v_1 = ||g_1||^2 is taken from a skipped step."""
    a, b = make_params("cuda", sizes=(100,)), make_params("cuda", sizes=(100,))
    oa, ob = FusedNovoGrad(a, lr=5e-2), FusedNovoGrad(b, lr=5e-2)
    a[0].grad = torch.full((100,), 1e4, device="cuda")
    oa.step(found_inf=torch.ones(1, device="cuda"))
    grads = make_grads(sizes=(100,), steps=3)
    run(oa, a, grads)
    run(ob, b, grads)
    assert torch.equal(a[0].detach(), b[0].detach())
    assert torch.equal(oa.state[a[0]]["exp_avg_sq"], ob.state[b[0]]["exp_avg_sq"])


@pytest.mark.parametrize("norm_type", [2, 0])
def test_grad_scale_divides_grads_and_norms_on_the_device(norm_type):
    kw = dict(lr=5e-2, norm_type=norm_type)
    a, b = make_params("cuda", sizes=(1000, 70000)), make_params("cuda", sizes=(1000, 70000))
    oa, ob = FusedNovoGrad(a, **kw), FusedNovoGrad(b, **kw)
    grads = make_grads(sizes=(1000, 70000), steps=3)
    run(oa, a, [[g * 1024 for g in gs] for gs in grads], grad_scale=torch.tensor([1024.0], device="cuda"))
    run(ob, b, grads)
    for p, q in zip(a, b):
        assert torch.equal(p.detach(), q.detach())
        assert torch.equal(oa.state[p]["exp_avg_sq"], ob.state[q]["exp_avg_sq"])  # norms of unscaled grads
    assert torch.equal(a[1].grad.cpu(), grads[-1][1])  # written back unscaled, exactly (a power of two)


@pytest.mark.parametrize("norm_type", [2, 0])
def test_grad_scale_matches_cpu_kernel(norm_type):
    kw = dict(lr=5e-2, weight_decay=0.05, norm_type=norm_type)
    gpu, cpu = make_params("cuda"), make_params("cpu")
    opt_gpu, opt_cpu = FusedNovoGrad(gpu, **kw), FusedNovoGrad(cpu, **kw)
    grads = make_grads()
    run(opt_gpu, gpu, grads, grad_scale=torch.tensor([3.0], device="cuda"))
    run(opt_cpu, cpu, grads, grad_scale=torch.tensor([3.0]))
    assert_match(opt_gpu, gpu, opt_cpu, cpu)


def op_lists(device, seed=0):
    """fused_novograd_'s lists for bf16 params with masters: many small tensors (more
    than one launch holds), one over several chunks, one channels_last, step counts
    that differ per tensor (0: a fresh second moment), given grad norms."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(1 + (i * 37) % 300,) for i in range(300)] + [(3 * 65536 + 7,), (2, 3, 5, 7)]
    lists = {k: [] for k in ("params", "grads", "exp_avgs", "exp_avg_sqs", "masters", "steps")}

    def place(t):
        t = t.to(device)
        return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t

    for i, shape in enumerate(shapes):
        p = torch.randn(shape, generator=g)
        lists["params"].append(place(p.to(torch.bfloat16)))
        lists["masters"].append(place(p.clone()))
        lists["grads"].append(torch.randn(shape, generator=g).to(torch.bfloat16).to(device))
        lists["exp_avgs"].append(place(torch.randn(shape, generator=g) * 0.1))
        lists["exp_avg_sqs"].append(torch.rand((), generator=g).to(device))
        lists["steps"].append(torch.full((), float(i % 5), device=device))
    lists["norms"] = (torch.rand(len(shapes), generator=g) * 10).to(device)
    return lists


def call_op(lists, norm_type=2, **kw):
    op("fused_novograd_")(lists["params"], lists["grads"], lists["exp_avgs"], lists["exp_avg_sqs"],
                          lists["masters"], lists["steps"], lists["norms"], norm_type, 1e-2, 0.95, 0.98,
                          1e-8, 0.01, True, False, True, False, False, kw.get("lr_tensor"),
                          kw.get("grad_scale"), kw.get("found_inf"))


@pytest.mark.parametrize("norm_type", [2, 0])
def test_many_tensors_channels_last_lr_tensor_match_cpu(norm_type):
    gpu, cpu = op_lists("cuda"), op_lists("cpu")
    for lists, device in ((gpu, "cuda"), (cpu, "cpu")):
        for _ in range(3):
            call_op(lists, norm_type, lr_tensor=torch.tensor([2e-2], dtype=torch.float64, device=device),
                    grad_scale=torch.tensor([3.0], device=device),
                    found_inf=torch.zeros(1, dtype=torch.int32, device=device))
    flat = lambda ts: torch.cat([t.detach().reshape(-1).cpu() for t in ts])  # noqa: E731
    for key in ("masters", "exp_avgs"):
        assert all(a.stride() == c.stride() for a, c in zip(gpu[key], cpu[key]))
        ulps_close(flat(gpu[key]), flat(cpu[key]), CPU_ULPS)
    for a, c in zip(gpu["exp_avg_sqs"], cpu["exp_avg_sqs"]):
        ulps_close(a, c, 2)  # the same norms given: one blend in double, rounded once
    for a, m in zip(gpu["params"], gpu["masters"]):
        assert torch.equal(a, m.to(torch.bfloat16))
    assert [s.item() for s in gpu["steps"]] == [s.item() for s in cpu["steps"]]


def test_no_host_sync():
    lists = op_lists("cuda")
    torch.cuda.set_sync_debug_mode("error")  # any synchronizing call in the op raises
    try:
        call_op(lists, grad_scale=torch.ones(1, device="cuda"), found_inf=torch.zeros(1, device="cuda"),
                lr_tensor=torch.full((1,), 1e-2, device="cuda"))
    finally:
        torch.cuda.set_sync_debug_mode(0)
