"""FusedAdam against torch.optim.Adam / AdamW on each device (the native kernels), and its
behaviour as a torch.optim.Optimizer: master weights, the GradScaler protocol, clipping,
state dicts; on a GPU also many tensors, misaligned and channels_last memory, and no
host sync (CUDA graphs). What every fused optimizer shares (skipped steps, grad_scale,
the CUDA kernel against the CPU kernel, ...) is in the generic tests that
optimizer_registry.py drives.

Note [Optimizer tolerances]: after 20 steps the fp32 params agree with torch.optim to
a few ulps of their magnitude (the CPU kernel rounds every + and * as torch does;
the pow in the bias corrections and sqrt may differ by an ulp); we allow 8 ulps of
the largest |param|. float64: the reference against torch in fp64, 1e-12.

Note [CUDA optimizer tolerances]: against the CPU kernel, none: the two devices run
one math header with the same roundings (Note [CUDA against CPU kernels] in
test_optimizer_device_contract.py), so params and state are compared bit for bit.

Against torch's fused CUDA Adam, two differences, one per kind:
- torch's kernel rounds beta1, beta2, lr and weight_decay to float32 before using them
  (FusedAdamMathFunctor's opmath casts), so it runs Adam with beta2 = float(0.999) =
  0.99900001287..., whose 1 - beta2 is 1.29e-5 relative off 0.001; ours and
  torch.optim's other paths take 1 - beta2 in double. That bias, not rounding, was the
  H200's exp_avg_sq failures (9.6e-7 relative with beta2 = 0.99, 1.28e-5 with 0.999).
  The comparisons therefore use hyperparameters that float32 holds exactly (1 - beta
  too, and lr * weight_decay), where the two formulas are the same function.
- Then only rounding order remains: torch forms m and v each as one fma expression
  (one rounding), we as torch.optim's single-tensor path (lerp and addcmul: one more
  rounding each, of at most half an ulp of the result), and the bias corrections come
  from float powf there, double pow here (an ulp of a coefficient: ~1e-9 of a param
  after 20 steps at these lr). m and v then differ by at most one ulp of their own value
  per step, decaying by beta after: <= 20 ulps after 20 steps; a param by at most one
  rounding of its own value per step when its update differs: <= 20 ulps; both in
  float32 ulps of the largest |expected| of the tensor (TORCH_FUSED["cuda"]).
"""

import copy
import warnings

import pytest
import torch
from optim_cases import (DEVICE_SIZES, DEVICES, STEPS, clone_params, flat, make_grads, make_params, no_host_sync,
                         run, ulps_close)
from optim_cases import native_kernels  # noqa: F401  (autouse)

import core_ops  # noqa: F401
from core_ops._schemas import op
from core_ops.optimizers import FusedAdam
from core_ops.reference import KERNELS as REF

# float32 holds these, and 1 - beta, lr * weight_decay and 1 - lr * weight_decay, exactly.
EXACT = dict(lr=2.0 ** -8, betas=(0.75, 1 - 2.0 ** -7), eps=2.0 ** -20, weight_decay=2.0 ** -4)
# Against torch's fused kernel on each device: (hyperparameters, ulps of a param, ulps of
# the state). The CPU: Note [Optimizer tolerances]; CUDA: Note [CUDA optimizer tolerances].
TORCH_FUSED = {"cpu": (dict(lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05), 8, 8),
               "cuda": (EXACT, 20, 20)}


def same_run_on_the_cpu(device, make, params, grads, **run_kwargs):
    """On a GPU, the optimizer ``make`` builds run over the same params and grads on the
    CPU (compared bit for bit: Note [CUDA optimizer tolerances]); None on the CPU."""
    if device == "cpu":
        return None
    cpu = [p.detach().cpu().requires_grad_() for p in params]
    opt = make(cpu)
    run(opt, cpu, grads, **run_kwargs)
    return opt, cpu


@pytest.mark.parametrize("adam_w_mode", [True, False], ids=["adamw", "adam"])
@pytest.mark.parametrize("amsgrad", [False, True], ids=["", "amsgrad"])
@pytest.mark.parametrize("maximize", [False, True], ids=["", "maximize"])
@pytest.mark.parametrize("device", DEVICES)
def test_fp32_matches_torch_fused(device, adam_w_mode, amsgrad, maximize):
    hyper, param_ulps, state_ulps = TORCH_FUSED[device]
    kw = dict(hyper, amsgrad=amsgrad, maximize=maximize)
    ours, theirs = make_params(sizes=DEVICE_SIZES, device=device), make_params(sizes=DEVICE_SIZES, device=device)
    start = [p.detach().clone() for p in ours]
    opt = FusedAdam(ours, adam_w_mode=adam_w_mode, **kw)
    ref = (torch.optim.AdamW if adam_w_mode else torch.optim.Adam)(theirs, fused=True, **kw)
    grads = make_grads(sizes=DEVICE_SIZES)
    run(opt, ours, grads)
    run(ref, theirs, grads)
    on_cpu = same_run_on_the_cpu(device, lambda ps: FusedAdam(ps, adam_w_mode=adam_w_mode, **kw), start, grads)
    keys = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if amsgrad else [])
    for i, (a, b) in enumerate(zip(ours, theirs)):
        ulps_close(a, b, param_ulps)
        for key in keys:
            ulps_close(opt.state[a][key], ref.state[b][key], state_ulps)
        assert opt.state[a]["step"].device == a.device and opt.state[a]["step"].dtype == torch.float32
        assert opt.state[a]["step"].item() == ref.state[b]["step"].item() == STEPS
        if on_cpu:
            opt_cpu, cpu = on_cpu
            ulps_close(a, cpu[i], 0)
            for key in keys:
                ulps_close(opt.state[a][key], opt_cpu.state[cpu[i]][key], 0)


def test_no_bias_correction_matches_reference():
    ours = make_params(sizes=(33,))
    theirs = clone_params(ours)
    opt = FusedAdam(ours, bias_correction=False, lr=1e-2)
    run(opt, ours, steps=5)
    # Reference kernel through the same optimizer: swap the op for the reference.
    state = {"exp_avg": torch.zeros(33), "exp_avg_sq": torch.zeros(33), "step": torch.zeros(())}
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        grad = torch.randn(33, generator=g)
        REF["fused_adam_"]([theirs[0].data], [grad], [state["exp_avg"]], [state["exp_avg_sq"]], [], [],
                           [state["step"]], 1e-2, 0.9, 0.999, 1e-8, 0.0, True, False, False, False,
                           None, None, None)
    ulps_close(ours[0].detach(), theirs[0].detach(), n=2)


def test_fp64_reference_matches_torch():
    ours = make_params(torch.float64)
    theirs = clone_params(ours)
    opt = FusedAdam(ours, lr=1e-2, weight_decay=0.1)
    ref = torch.optim.AdamW(theirs, lr=1e-2, weight_decay=0.1, foreach=False)
    run(opt, ours)
    run(ref, theirs)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-12, atol=1e-12)


# Against torch's fused AdamW on float32 copies: (hyperparameters, ulps of the master,
# ulps of exp_avg_sq), as TORCH_FUSED.
MASTERS = {"cpu": (dict(lr=1e-2, weight_decay=0.01), 8, 8),
           "cuda": (dict(EXACT, betas=(0.875, 1 - 2.0 ** -10)), 20, 20)}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("device", DEVICES)
def test_master_weights_follow_the_fp32_run(device, dtype):
    kw, master_ulps, state_ulps = MASTERS[device]
    ours = make_params(dtype, sizes=DEVICE_SIZES, device=device)
    start = [p.detach().clone() for p in ours]
    fp32 = clone_params(ours, torch.float32)  # the same rounded start
    opt = FusedAdam(ours, master_weights=True, **kw)
    ref = torch.optim.AdamW(fp32, fused=True, **kw)
    grads = make_grads(sizes=DEVICE_SIZES, dtype=dtype)  # rounded to the param dtype once; fp32 torch is fed the same
    run(opt, ours, grads)
    run(ref, fp32, grads, dtype=torch.float32)
    on_cpu = same_run_on_the_cpu(device, lambda ps: FusedAdam(ps, master_weights=True, **kw), start, grads)
    for i, (a, b) in enumerate(zip(ours, fp32)):
        master = opt.state[a]["master_param"]
        assert master.dtype == torch.float32 and master.device == a.device
        ulps_close(master, b, master_ulps)
        assert torch.equal(a.detach(), master.to(dtype))  # the param is the master, rounded
        assert opt.state[a]["exp_avg"].dtype == torch.float32
        ulps_close(opt.state[a]["exp_avg_sq"], ref.state[b]["exp_avg_sq"], state_ulps)
        assert opt.state[a]["step"].item() == STEPS
        if on_cpu:
            ulps_close(master, on_cpu[0].state[on_cpu[1][i]]["master_param"], 0)


def test_half_params_without_masters_keep_fp32_state():
    ours = make_params(torch.bfloat16, sizes=(100,))
    opt = FusedAdam(ours, lr=1e-2)
    run(opt, ours, steps=3)
    assert opt.state[ours[0]]["exp_avg"].dtype == torch.float32
    assert "master_param" not in opt.state[ours[0]]


@pytest.mark.parametrize("device", DEVICES)
def test_torch_grad_scaler_protocol_matches_torch_fused(device):
    torch.manual_seed(0)
    models = [torch.nn.Linear(64, 32).to(device), None]
    models[1] = copy.deepcopy(models[0])
    opts = [FusedAdam(models[0].parameters(), lr=1e-2, weight_decay=0.01),  # Apex's default is 0,
            torch.optim.AdamW(models[1].parameters(), lr=1e-2, weight_decay=0.01, fused=True)]  # torch's 0.01
    scalers = [torch.amp.GradScaler(device, init_scale=2.0 ** 10) for _ in models]
    x = torch.randn(16, 64, device=device)
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
        ulps_close(a, b, TORCH_FUSED[device][1])
        assert opts[0].state[a]["step"].item() == 5


def test_max_grad_norm_matches_unscale_clip_step():
    torch.manual_seed(0)
    a = make_params(sizes=(300, 40))
    b = clone_params(a)
    oa, ob = FusedAdam(a, lr=1e-2), torch.optim.AdamW(b, lr=1e-2, weight_decay=0.0, fused=True)
    scale = torch.tensor([256.0])
    for _ in range(5):
        grads = [torch.randn(p.shape) * 3 for p in a]
        for p, q, g in zip(a, b, grads):
            p.grad, q.grad = g * 256, g.clone()
        found = torch.zeros(1)
        oa.step(grad_scale=scale, found_inf=found, max_grad_norm=1.0)
        norm = torch.nn.utils.clip_grad_norm_(b, 1.0)
        ob.step()
        assert found.item() == 0
        torch.testing.assert_close(oa.last_grad_norm, norm, rtol=1e-5, atol=0)
    for p, q in zip(a, b):
        ulps_close(p.detach(), q.detach(), n=64)  # clip coefficient rounds differently


def test_max_grad_norm_flags_overflow():
    a = make_params(sizes=(30,))
    opt = FusedAdam(a, lr=1e-2)
    a[0].grad = torch.full((30,), float("inf"))
    before = a[0].detach().clone()
    found = torch.zeros(1)
    opt.step(found_inf=found, max_grad_norm=1.0)
    assert found.item() == 1 and torch.equal(a[0].detach(), before)
    assert opt.state[a[0]]["step"].item() == 0


@pytest.mark.parametrize("source", ["torch_adam", "torch_adamw"])
def test_torch_state_dict_loads_and_continues(source):
    a = make_params(sizes=(64, 7))
    b = clone_params(a)
    adamw = source == "torch_adamw"
    T = torch.optim.AdamW if adamw else torch.optim.Adam
    ref = T(a, lr=1e-2, weight_decay=0.1)
    run(ref, a, steps=5)
    for p, q in zip(a, b):
        q.data.copy_(p.data)
    ours = FusedAdam(b, lr=1.0, adam_w_mode=not adamw)  # the state dict must win
    ours.load_state_dict(ref.state_dict())
    assert ours.param_groups[0]["adam_w_mode"] is adamw and ours.param_groups[0]["lr"] == 1e-2
    run(ref, a, steps=5, seed=7)
    run(ours, b, steps=5, seed=7)
    for p, q in zip(a, b):
        ulps_close(q.detach(), p.detach())


@pytest.mark.parametrize("adamw", [False, True])
def test_a_torch_2_6_state_dict_keeps_the_constructor_s_mode_and_says_so(adamw):
    """torch's Adam / AdamW saved no decoupled_weight_decay before 2.7: which decay the
    checkpoint used is unknown, so the group keeps FusedAdam's and a warning says how to
    set it."""
    a = make_params(sizes=(64, 7))
    ref = (torch.optim.AdamW if adamw else torch.optim.Adam)(a, lr=1e-2, weight_decay=0.1)
    run(ref, a, steps=2)
    state = ref.state_dict()
    del state["param_groups"][0]["decoupled_weight_decay"]  # as torch 2.6 wrote it
    ours = FusedAdam(clone_params(a), lr=1.0, adam_w_mode=not adamw)
    with pytest.warns(UserWarning, match=f"it keeps this FusedAdam's adam_w_mode={not adamw}"):
        ours.load_state_dict(state)
    assert ours.param_groups[0]["adam_w_mode"] is (not adamw) and ours.param_groups[0]["lr"] == 1e-2
    state["param_groups"][0]["weight_decay"] = 0.0  # no decay: the mode does not matter, nothing said
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FusedAdam(clone_params(a), adam_w_mode=not adamw).load_state_dict(state)


def test_our_state_dict_loads_into_torch_and_continues():
    a = make_params(sizes=(64, 7))
    ours = FusedAdam(a, lr=1e-2, weight_decay=0.1)
    run(ours, a, steps=5)
    b = clone_params(a)
    ref = torch.optim.AdamW(b, lr=5.0, weight_decay=0.0)
    ref.load_state_dict(copy.deepcopy(ours.state_dict()))  # as from a checkpoint file
    assert ref.param_groups[0]["weight_decay"] == 0.1 and ref.param_groups[0]["lr"] == 1e-2
    run(ours, a, steps=5, seed=7)
    run(ref, b, steps=5, seed=7)
    for p, q in zip(a, b):
        ulps_close(q.detach(), p.detach())


def test_checkpoint_round_trip_with_master_weights_is_exact():
    a = make_params(torch.bfloat16, sizes=(129, 3))
    opt = FusedAdam(a, lr=1e-2, master_weights=True)
    run(opt, a, steps=3)
    sd = copy.deepcopy(opt.state_dict())
    b = clone_params(a)
    resumed = FusedAdam(b, lr=1e-2, master_weights=True)
    resumed.load_state_dict(sd)
    assert resumed.state[b[0]]["master_param"].dtype == torch.float32
    run(opt, a, steps=4, seed=9)
    run(resumed, b, steps=4, seed=9)
    for p, q in zip(a, b):
        assert torch.equal(p, q)
        assert torch.equal(opt.state[p]["master_param"], resumed.state[q]["master_param"])


def test_param_groups_lr_tensor_scheduler_and_zero_grad():
    a, b = make_params(sizes=(50,)), make_params(seed=5, sizes=(20,))
    a2, b2 = clone_params(a), clone_params(b)
    opt = FusedAdam([{"params": a, "lr": torch.tensor(1e-2)}, {"params": b, "weight_decay": 0.5}], lr=1e-3,
                    weight_decay=0.01)
    ref = torch.optim.AdamW([{"params": a2, "lr": torch.tensor(1e-2)}, {"params": b2, "weight_decay": 0.5}], lr=1e-3,
                            weight_decay=0.01, fused=True)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    rsched = torch.optim.lr_scheduler.StepLR(ref, step_size=2, gamma=0.5)
    g = torch.Generator().manual_seed(2)
    for _ in range(6):
        for p, q in zip(a + b, a2 + b2):
            p.grad = torch.randn(p.shape, generator=g)
            q.grad = p.grad.clone()
        opt.step(), ref.step(), sched.step(), rsched.step()
    for p, q in zip(a + b, a2 + b2):
        ulps_close(p.detach(), q.detach())
    opt.zero_grad()
    assert all(p.grad is None for p in a + b)
    opt.add_param_group({"params": make_params(seed=9, sizes=(4,)), "lr": 0.1})
    assert opt.param_groups[-1]["betas"] == (0.9, 0.999)


@pytest.mark.parametrize("layout", ["", "channels_last"])
@pytest.mark.parametrize("scaled", [False, True], ids=["", "grad_scale"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_master_grads_step_the_masters_and_write_the_half_params(dtype, scaled, layout):
    """Note [Master grads]: float32 grads with master_params (amp O2's masters' grads,
    contiguous where the params are channels_last: the kernel's copy in their layout).
    The CPU kernel gives the reference's bits, which are the fp32 step of the masters
    with those grads, then the masters rounded into the half params."""
    g = torch.Generator().manual_seed(5)
    shapes = [(1, 3, 5, 7), (2, 16, 33, 1), (5000,)]

    def lay(t):
        return t.contiguous(memory_format=torch.channels_last) if layout and t.dim() == 4 else t

    masters = [lay(torch.randn(s, generator=g)) for s in shapes]
    grads = [torch.randn(s, generator=g) for s in shapes]  # contiguous: another layout for channels_last
    scale = torch.tensor([4.0]) if scaled else None
    hyper = (1e-2, 0.9, 0.999, 1e-8, 0.01, True, True, False, False)

    def lists(params, grad_list, master_list):
        state = [[lay(torch.zeros(s)) for s in shapes] for _ in range(2)]
        return [params, grad_list, *state, [], master_list, [torch.zeros(()) for _ in shapes]]

    runs = {}
    for name, kernel in (("native", op("fused_adam_")), ("reference", REF["fused_adam_"])):
        ls = lists([m.to(dtype) for m in masters], [t.clone() for t in grads], [m.clone() for m in masters])
        for _ in range(3):
            kernel(*ls, *hyper, None, scale, None)
        runs[name] = ls
    fp32 = lists([m.clone() for m in masters], [t.clone() for t in grads], [])
    for _ in range(3):
        op("fused_adam_")(*fp32, *hyper, None, scale, None)
    for i, key in enumerate(("params", "grads", "exp_avgs", "exp_avg_sqs")):
        for a, b in zip(runs["native"][i], runs["reference"][i]):
            assert a.dtype == b.dtype and torch.equal(a, b), key
    for a, b, m in zip(runs["native"][0], runs["native"][5], fp32[0]):
        assert torch.equal(b, m) and torch.equal(a, m.to(dtype))  # the masters and their rounding
        assert a.stride() == m.to(dtype).stride()
    for a, b in zip(runs["native"][1], fp32[1]):
        assert torch.equal(a, b)  # unscaled grads written back as the fp32 step writes them


@pytest.mark.gpu
def test_master_grads_are_refused_on_cuda_by_name():
    """Note [Master grads] is the CPU kernel's: the CUDA kernel says so, reading nothing."""
    masters = [torch.randn(64, device="cuda")]
    args = [[m.to(torch.bfloat16) for m in masters], [torch.ones(64, device="cuda")], [torch.zeros(64, device="cuda")],
            [torch.zeros(64, device="cuda")], [], masters, [torch.zeros((), device="cuda")],
            1e-3, 0.9, 0.999, 1e-8, 0.0, True, True, False, False, None, None, None]
    with pytest.raises(TypeError, match="on CUDA, grads take the params' dtype"):
        op("fused_adam_")(*args)


def test_float32_grads_of_half_params_need_master_params():
    params = [torch.zeros(8, dtype=torch.bfloat16)]
    args = [params, [torch.ones(8)], [torch.zeros(8)], [torch.zeros(8)], [], [], [torch.zeros(())],
            1e-3, 0.9, 0.999, 1e-8, 0.0, True, True, False, False, None, None, None]
    for kernel in (op("fused_adam_"), REF["fused_adam_"]):
        with pytest.raises(TypeError, match="float32 grads are taken with master_params"):
            kernel(*args)


def test_bad_input():
    p = torch.zeros(3, requires_grad=True)
    for kwargs, match in [(dict(lr=-1.0), "lr"), (dict(betas=(1.0, 0.9)), "betas"), (dict(eps=-1e-8), "eps"),
                          (dict(weight_decay=-0.1), "weight_decay")]:
        with pytest.raises(ValueError, match=match):
            FusedAdam([p], **kwargs)
    with pytest.raises(ValueError, match="twice"):
        FusedAdam([p, p])
    with pytest.raises(ValueError, match="non-leaf"):
        FusedAdam([p * 2])
    with pytest.raises(TypeError, match="unexpected keyword"):
        FusedAdam([p], momentum=0.9)
    opt = FusedAdam([p])
    p.grad = torch.zeros(3).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        opt.step()
    q = torch.zeros(4, requires_grad=True)
    other = FusedAdam([q])
    q.grad = torch.ones(4)
    other.step()
    p.grad = torch.ones(3)
    with pytest.raises(ValueError, match="another model"):
        opt.load_state_dict(other.state_dict())


@pytest.mark.inductor_cpu
def test_compiled_step_with_master_weights_matches_eager():
    """Updates below a bf16 ulp accumulate in the masters under torch.compile too: the
    write check of Note [Writes to half params] stays out of the compiled step (its
    compare, compiled, skipped the rounding and took every param into its master)."""
    def train(compiled):
        p = torch.nn.Parameter(torch.ones(1024, dtype=torch.bfloat16))
        opt = FusedAdam([p], lr=1e-3, master_weights=True)
        step = torch.compile(opt.step) if compiled else opt.step
        for _ in range(12):
            p.grad = torch.ones_like(p)
            step()
        return p.detach(), opt.state[p]["master_param"]

    (p_c, m_c), (p_e, m_e) = train(True), train(False)
    assert p_e.float().mean().item() < 1.0  # the small updates added up to a bf16 step
    assert torch.equal(p_c, p_e)
    torch.testing.assert_close(m_c, m_e, rtol=1e-6, atol=0)


# ---- the op on a GPU: many tensors, odd memory, no host sync ----------------------

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


@pytest.mark.gpu
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
        ulps_close(flat(gpu[key]), flat(cpu[key]), 0)
    for i, (a, c, m) in enumerate(zip(gpu["params"], cpu["params"], gpu["masters"])):
        assert torch.equal(a, m.to(torch.bfloat16)), i
    assert [s.item() for s in gpu["steps"]] == [s.item() for s in cpu["steps"]] == [i % 5 + 3.0 for i in range(403)]


@pytest.mark.gpu
def test_no_host_sync_and_cuda_graph_replay():
    eager, graphed = op_lists("cuda", n_small=20), op_lists("cuda", n_small=20)
    scale = torch.tensor([2.0], device="cuda")
    found = torch.zeros(1, device="cuda")
    with no_host_sync():
        call_op(eager, grad_scale=scale, found_inf=found)
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


@pytest.mark.parametrize("device", DEVICES)
def test_amsgrad_keeps_a_nan_in_its_running_max_as_torch(device):
    # torch.optim takes the max with torch.maximum, which keeps a NaN. The native
    # kernels' vector lanes did too, their scalar tail and CUDA (fmax) dropped it, so a
    # NaN grad's max_exp_avg_sq depended on where in the tensor it sat (the fuzz harness).
    from core_ops import native
    from core_ops._schemas import op
    assert native.ensure(device).native
    n = 17  # one element past two AVX2 vectors: index 16 is the scalar tail
    for at in (0, n - 1):
        p, g = torch.zeros(n, device=device), torch.ones(n, device=device)
        g[at] = float("nan")
        m, v, vmax = torch.zeros_like(p), torch.zeros_like(p), torch.full_like(p, 5.0)
        op("fused_adam_")([p], [g], [m], [v], [vmax], [], [torch.zeros(1, device=device)], 1e-3, 0.9, 0.999, 1e-8,
                          0.0, True, True, True, False, None, None, None)
        want = torch.maximum(torch.full((n,), 5.0), torch.full((n,), 0.001).index_fill(0, torch.tensor([at]),
                                                                                       float("nan")))
        torch.testing.assert_close(vmax.cpu(), want, equal_nan=True, rtol=0, atol=0)


def test_opcheck(device):
    """fused_adam_'s schema, fake kernel and dispatch (torch.library.opcheck)."""
    ts = [torch.randn(n, device=device) for n in (3, 17, 16385)]
    flag, one = torch.zeros(1, device=device), torch.ones(1, device=device)
    torch.library.opcheck(torch.ops.core_ops.fused_adam_.default,
        ([t.clone() for t in ts], [torch.randn_like(t) for t in ts],
         [torch.zeros_like(t) for t in ts], [torch.zeros_like(t) for t in ts], [], [],
         [torch.zeros((), device=device) for _ in ts], 1e-3, 0.9, 0.999, 1e-8, 0.01,
         True, True, False, False, None, one * 8.0, flag.clone()))
