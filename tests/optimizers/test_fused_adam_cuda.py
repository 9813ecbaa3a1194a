"""FusedAdam's CUDA kernel (GPU machines only) against the native CPU kernel and
torch.optim's fused CUDA Adam / AdamW: numerics over 20 steps, master weights,
found_inf and grad_scale read on the device, many tensors, misaligned and
channels_last memory, no host sync (CUDA graphs).

Note [CUDA optimizer tolerances]: the CUDA kernel runs the same math as the CPU
kernel (core_ops/adam_math.h) but nvcc fuses multiply-adds (m, v, and AdamW's
p*(1-lr*wd) + update into one FMA) where the CPU kernel, built with
-ffp-contract=off, rounds twice. A param then differs by at most one ulp of its own
value per step, with a random sign; over 20 steps that random walk reaches ~20 ulps
of a value in the worst of ~10^5 elements, which is ~5 ulps of the largest |param|
(measured on an FMA emulation of the kernel). torch's fused CUDA kernel computes the
decay and the moments in double, ours rounds 1 - lr*wd to float as torch.optim's
single-tensor path does: a further <= 0.5 ulp per step, ~10 ulps of the largest
|param| after 20 steps. Hence, in float32 ulps of the largest |expected| value:
12 against the CPU kernel, 20 against torch, 8 for exp_avg / exp_avg_sq (within ~4).
"""

import copy

import pytest
import torch
from cuda_cases import _both_native  # noqa: F401  (autouse: both native libraries loaded)
from cuda_cases import STEPS, assert_unchanged, make_grads, make_params, run, snapshot, ulps_close

import core_ops  # noqa: F401  (registers the ops)
from core_ops._library import op
from core_ops.optimizers import FusedAdam

pytestmark = pytest.mark.gpu

CPU_ULPS, TORCH_ULPS, STATE_ULPS = 12, 20, 8


@pytest.mark.parametrize("adam_w_mode", [True, False], ids=["adamw", "adam"])
@pytest.mark.parametrize("amsgrad", [False, True], ids=["", "amsgrad"])
@pytest.mark.parametrize("maximize", [False, True], ids=["", "maximize"])
def test_fp32_matches_cpu_kernel_and_torch_fused(adam_w_mode, amsgrad, maximize):
    kw = dict(lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05, amsgrad=amsgrad, maximize=maximize)
    gpu, cpu, ref = make_params("cuda"), make_params("cpu"), make_params("cuda")
    opt_gpu = FusedAdam(gpu, adam_w_mode=adam_w_mode, **kw)
    opt_cpu = FusedAdam(cpu, adam_w_mode=adam_w_mode, **kw)
    opt_ref = (torch.optim.AdamW if adam_w_mode else torch.optim.Adam)(ref, fused=True, **kw)
    grads = make_grads()
    for opt, ps in ((opt_gpu, gpu), (opt_cpu, cpu), (opt_ref, ref)):
        run(opt, ps, grads)
    keys = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if amsgrad else [])
    for a, c, r in zip(gpu, cpu, ref):
        sa, sc, sr = opt_gpu.state[a], opt_cpu.state[c], opt_ref.state[r]
        ulps_close(a, c, CPU_ULPS)
        ulps_close(a, r, TORCH_ULPS)
        for key in keys:
            ulps_close(sa[key], sc[key], STATE_ULPS)
            ulps_close(sa[key], sr[key], STATE_ULPS)
        assert sa["step"].device == a.device and sa["step"].dtype == torch.float32
        assert sa["step"].item() == sc["step"].item() == sr["step"].item() == STEPS


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_master_weights_follow_the_fp32_run(dtype):
    kw = dict(lr=1e-2, weight_decay=0.01)
    gpu, cpu = make_params("cuda", dtype), make_params("cpu", dtype)
    fp32 = [p.detach().float().requires_grad_() for p in make_params("cuda", dtype)]  # the same rounded start
    opt_gpu = FusedAdam(gpu, master_weights=True, **kw)
    opt_cpu = FusedAdam(cpu, master_weights=True, **kw)
    opt_ref = torch.optim.AdamW(fp32, fused=True, **kw)
    grads = make_grads(dtype=dtype)  # rounded to the param dtype once; fp32 torch is fed the same values
    run(opt_gpu, gpu, grads)
    run(opt_cpu, cpu, grads)
    run(opt_ref, fp32, grads, dtype=torch.float32)
    for a, c, r in zip(gpu, cpu, fp32):
        master = opt_gpu.state[a]["master_param"]
        assert master.dtype == torch.float32 and master.device == a.device
        ulps_close(master, r, TORCH_ULPS)
        ulps_close(master, opt_cpu.state[c]["master_param"], CPU_ULPS)
        assert torch.equal(a.detach(), master.to(dtype))  # the param is the master, rounded
        ulps_close(opt_gpu.state[a]["exp_avg_sq"], opt_ref.state[r]["exp_avg_sq"], STATE_ULPS)
        assert opt_gpu.state[a]["step"].item() == STEPS


def test_fp64_matches_cpu_kernel():
    kw = dict(lr=1e-2, weight_decay=0.1, amsgrad=True)
    gpu, cpu = make_params("cuda", torch.float64), make_params("cpu", torch.float64)
    opt_gpu, opt_cpu = FusedAdam(gpu, **kw), FusedAdam(cpu, **kw)
    grads = make_grads(dtype=torch.float64)
    run(opt_gpu, gpu, grads)
    run(opt_cpu, cpu, grads)
    for a, c in zip(gpu, cpu):
        assert opt_gpu.state[a]["exp_avg"].dtype == torch.float64
        torch.testing.assert_close(a.detach().cpu(), c.detach(), rtol=1e-12, atol=1e-12)


def test_found_inf_skips_everything():
    # bf16 + master + amsgrad: all six lists, the deepest launch.
    params = make_params("cuda", torch.bfloat16, sizes=(17, 300, 65536 + 1))
    opt = FusedAdam(params, lr=1e-2, master_weights=True, amsgrad=True)
    grads = make_grads(sizes=(17, 300, 65536 + 1), steps=3)
    run(opt, params, grads[:2])
    before = snapshot(opt, params)
    for flag in (torch.ones(1, device="cuda"), torch.ones(1, dtype=torch.int32, device="cuda")):
        run(opt, params, grads[2:], found_inf=flag)
        assert_unchanged(before, opt, params)
        assert all(torch.equal(p.grad.cpu(), g.to(p.dtype)) for p, g in zip(params, grads[2]))  # untouched
        assert flag.item() == 1  # read, never written
    run(opt, params, grads[2:], found_inf=torch.zeros(1, device="cuda"))
    assert all(opt.state[p]["step"].item() == 3 for p in params)
    assert not torch.equal(params[2].detach(), before[0][2])


def test_grad_scale_divides_grads_on_the_device():
    a, b = make_params("cuda", sizes=(1000, 70000)), make_params("cuda", sizes=(1000, 70000))
    oa, ob = FusedAdam(a, lr=1e-2), FusedAdam(b, lr=1e-2)
    g = [torch.randn(p.shape, device="cuda") for p in a]
    for p, q, x in zip(a, b, g):
        p.grad, q.grad = x * 1024, x.clone()
    oa.step(grad_scale=torch.tensor([1024.0], device="cuda"))  # a power of two: exact
    ob.step()
    for p, q, x in zip(a, b, g):
        assert torch.equal(p.detach(), q.detach())
        assert torch.equal(p.grad, x)  # written back unscaled, exactly (a power of two)


@pytest.mark.parametrize("maximize", [False, True], ids=["", "maximize"])
def test_grad_scale_matches_cpu_kernel(maximize):
    kw = dict(lr=3e-3, weight_decay=0.05, maximize=maximize)
    gpu, cpu = make_params("cuda"), make_params("cpu")
    opt_gpu, opt_cpu = FusedAdam(gpu, **kw), FusedAdam(cpu, **kw)
    grads = make_grads()
    run(opt_gpu, gpu, grads, grad_scale=torch.tensor([3.0], device="cuda"))
    run(opt_cpu, cpu, grads, grad_scale=torch.tensor([3.0]))
    for a, c in zip(gpu, cpu):
        ulps_close(a, c, CPU_ULPS)


def test_torch_grad_scaler_protocol_matches_torch_fused():
    torch.manual_seed(0)
    models = [torch.nn.Linear(64, 32).cuda(), None]
    models[1] = copy.deepcopy(models[0])
    opts = [FusedAdam(models[0].parameters(), lr=1e-2, weight_decay=0.01),
            torch.optim.AdamW(models[1].parameters(), lr=1e-2, weight_decay=0.01, fused=True)]
    scalers = [torch.amp.GradScaler("cuda", init_scale=2.0 ** 10), torch.amp.GradScaler("cuda", init_scale=2.0 ** 10)]
    x = torch.randn(16, 64, device="cuda")
    for step in range(6):
        for model, opt, scaler in zip(models, opts, scalers):
            opt.zero_grad()
            scaler.scale(model(x).square().mean()).backward()
            if step == 3:  # an overflow: both must skip and back off
                next(model.parameters()).grad[0, 0] = float("inf")
            scaler.step(opt)
            scaler.update()
    assert scalers[0].get_scale() == scalers[1].get_scale() == 2.0 ** 9
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        ulps_close(a, b, TORCH_ULPS)
        assert opts[0].state[a]["step"].item() == 5


def op_lists(device, n_small=400, seed=0):
    """fused_adam_'s lists for bf16 params with masters and amsgrad (depth 6, 159
    tensors a launch): n_small small tensors, one over several chunks, one misaligned
    (a view one element into its storage, every list alike) and one channels_last."""
    g = torch.Generator().manual_seed(seed)
    sizes = [(1 + (i * 37) % 300,) for i in range(n_small)] + [(3 * 65536 + 7,), (5000,), (2, 3, 5, 7)]

    def new(shape, dtype, scale=1.0, zero=False):
        base = torch.zeros(shape) if zero else torch.randn(shape, generator=g) * scale
        return base.to(dtype)

    def place(t, i):
        if i == n_small + 1:  # misaligned: storage offset of one element
            buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=device)
            view = buf[1:]
            view.copy_(t)
            return view
        t = t.to(device)
        return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t

    lists = {k: [] for k in ("params", "grads", "exp_avgs", "exp_avg_sqs", "maxes", "masters", "steps")}
    for i, shape in enumerate(sizes):
        p = new(shape, torch.float32)
        lists["params"].append(place(p.to(torch.bfloat16), i))
        lists["masters"].append(place(p.clone(), i))
        lists["grads"].append(new(shape, torch.bfloat16).to(device))  # contiguous: copied into the param's layout
        lists["exp_avgs"].append(place(new(shape, torch.float32, 0.1), i))
        lists["exp_avg_sqs"].append(place(new(shape, torch.float32, 0.1).abs(), i))
        lists["maxes"].append(place(new(shape, torch.float32, 0.1).abs(), i))
        lists["steps"].append(torch.full((), float(i % 5), device=device))
    return lists


def call_op(lists, lr_tensor=None, grad_scale=None, found_inf=None, lr=1e-2):
    op("fused_adam_")(lists["params"], lists["grads"], lists["exp_avgs"], lists["exp_avg_sqs"], lists["maxes"],
                      lists["masters"], lists["steps"], lr, 0.9, 0.999, 1e-8, 0.01, True, True, True, False,
                      lr_tensor, grad_scale, found_inf)


@pytest.mark.parametrize("lr_dtype", [torch.float32, torch.float64, torch.bfloat16], ids=["lr32", "lr64", "lr_bf16"])
def test_many_tensors_misaligned_and_channels_last_match_cpu(lr_dtype):
    gpu, cpu = op_lists("cuda"), op_lists("cpu")
    assert gpu["params"][-2].data_ptr() % 8 != 0 and not gpu["params"][-1].is_contiguous()
    for lists, device in ((gpu, "cuda"), (cpu, "cpu")):
        for _ in range(3):
            call_op(lists, lr_tensor=torch.tensor([2e-2], dtype=lr_dtype, device=device),
                    grad_scale=torch.tensor([3.0], device=device),
                    found_inf=torch.zeros(1, dtype=torch.int32, device=device))
    for key in ("masters", "exp_avgs", "exp_avg_sqs", "maxes"):
        assert all(a.stride() == c.stride() for a, c in zip(gpu[key], cpu[key]))
        # One magnitude for the whole list: a two-element tensor may cancel to ~0.
        flat = lambda ts: torch.cat([t.detach().reshape(-1).cpu() for t in ts])  # noqa: E731
        ulps_close(flat(gpu[key]), flat(cpu[key]), CPU_ULPS)
    for i, (a, c, m) in enumerate(zip(gpu["params"], cpu["params"], gpu["masters"])):
        assert torch.equal(a, m.to(torch.bfloat16)), i
    assert [s.item() for s in gpu["steps"]] == [s.item() for s in cpu["steps"]] == [i % 5 + 3.0 for i in range(403)]


def test_no_host_sync_and_cuda_graph_replay():
    eager, graphed = op_lists("cuda", n_small=20), op_lists("cuda", n_small=20)
    scale = torch.tensor([2.0], device="cuda")
    found = torch.zeros(1, device="cuda")
    torch.cuda.set_sync_debug_mode("error")  # any synchronizing call in the op raises
    try:
        call_op(eager, grad_scale=scale, found_inf=found)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call_op(graphed, grad_scale=scale, found_inf=found)
    torch.cuda.synchronize()
    assert [s.item() for s in graphed["steps"]] == [i % 5 for i in range(23)]  # captured, not run
    for _ in range(2):
        graph.replay()
    call_op(eager, grad_scale=scale, found_inf=found)
    found.fill_(1)  # a replayed step reads the flag on the device: skipped, steps included
    graph.replay()
    call_op(eager, grad_scale=scale, found_inf=found)
    torch.cuda.synchronize()
    for key in ("params", "masters", "exp_avgs", "exp_avg_sqs", "maxes", "steps"):
        for a, b in zip(eager[key], graphed[key]):
            assert torch.equal(a, b), key
    assert [s.item() for s in graphed["steps"]] == [i % 5 + 2.0 for i in range(23)]
