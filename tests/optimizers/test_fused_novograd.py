"""FusedNovoGrad against Apex's NovoGrad written here in float64, each device's kernel
against the ones below it (on the CPU the reference kernel, on a GPU the CPU's; GPU
machines only), master weights, both norm types and moment modes, grad_scale and
skipped steps (a skipped first step leaves the first step to come), state dicts, and on
a GPU many tensors, channels_last memory, no host sync. What every fused optimizer
shares: the generic tests of optimizer_registry.py.

The float64 formula (``apex_novograd``) follows NVIDIA/apex: apex/optimizers/fused_novograd.py
(state init, moment_mode = 0 if reg_inside_moment else 1), csrc/multi_tensor_novograd.cu (the
element math of both moment modes, bias corrections, where eps goes) and the norm blend of
multi_tensor_norm_out_cuda in csrc/multi_tensor_l2norm_kernel.cu, in Apex's own terms: the
stored per-layer value is the norm gn itself, blended as gn = sqrt(beta2*gn^2 + (1-beta2)*n^2)
(L2) or gn = beta2*gn + (1-beta2)*n (max|g|), first set to the first step's norm unless
init_zero. Our exp_avg_sq holds gn^2 (L2) or gn (max|g|).

Tolerance: after 20 steps the fp32 params and exp_avg are within 8 ulps of the
largest |value| of the float64 run (as Note [Optimizer tolerances] in
test_fused_adam.py). Each step rounds the param once (half an ulp) and the update a
few times relative to the update itself (lr * O(1) at most); the norm is accumulated
in float32 (~1e-7 relative, entering the update, not the param directly). The errors
of 20 steps are independent and mostly cancel: measured at most 4 ulps over all the
cases (3.9 with init_zero, L2; the others 3.2 or less). exp_avg_sq is a
float32-accumulated norm (squared for L2): 1e-5 relative (measured 1.4e-7).

Against the kernels below (BELOW), in float32 ulps of the largest |expected|: the
reference runs torch's ops (Note [Test tolerances]) and sums the norms in torch's order,
moving the second moment by a few ulps (measured 6.2); the CUDA kernel runs the CPU
kernel's math (core_ops/novograd_math.h) with the same roundings, but the grad norms are
summed in another order on the GPU (multi_tensor_l2norm), moving each per-tensor
coefficient by a few ulps: a param then moves by about one ulp of its value per step,
with a random sign: 12 against the CPU kernel, 8 for the moments (Note [CUDA optimizer
tolerances] in test_fused_adam.py).
"""

import copy
import math

import pytest
import torch
from optim_cases import (DEVICE_SIZES, DEVICES, STEPS, assert_lists_match, assert_no_host_sync, clone_params,
                         make_grads, make_params, many_shapes, op_on_gpu_and_cpu, place, run, runs_below, ulps_close)
from optim_cases import native_kernels  # noqa: F401  (autouse)

import core_ops
import core_ops.optimizers.fused_novograd
from core_ops._schemas import op
from core_ops.multi_tensor_apply import ops
from core_ops.optimizers import FusedAdam, FusedNovoGrad
from core_ops.reference import KERNELS as REF

LR, BETAS = 0.05, (0.95, 0.98)
# The kernels below each device's: (ulps of a param, ulps of a moment).
BELOW = {"cpu": (8, 8), "cuda": (12, 8)}


def grads_for(params, steps=STEPS, seed=1):
    return make_grads([p.numel() for p in params], steps, seed)


def apex_novograd(p, grads, lr=LR, betas=BETAS, eps=1e-8, weight_decay=0.0, reg_inside_moment=False,
                  grad_averaging=True, norm_type=2, init_zero=False, bias_correction=True, maximize=False):
    """One tensor's trajectory under Apex's FusedNovoGrad, in float64: (param, exp_avg,
    exp_avg_sq as we store it). ``maximize`` (not in Apex) negates the grad."""
    beta1, beta2 = betas
    beta3 = 1 - beta1 if grad_averaging else 1.0
    p, m = p.double(), torch.zeros_like(p, dtype=torch.float64)
    gn = None
    for t, g in enumerate(grads, 1):
        g = -g.double() if maximize else g.double()
        n = g.norm() if norm_type == 2 else g.abs().max()
        if gn is None:  # Apex's state init, then the blend runs on step 1 as well
            gn = torch.zeros((), dtype=torch.float64) if init_zero else n
        if norm_type == 2:
            gn = (beta2 * gn ** 2 + (1 - beta2) * n ** 2).sqrt()
        else:
            gn = beta2 * gn + (1 - beta2) * n
        bc1, bc2 = (1 - beta1 ** t, math.sqrt(1 - beta2 ** t)) if bias_correction else (1.0, 1.0)
        denom = gn / bc2 + eps
        if reg_inside_moment:  # moment_mode 0
            m = beta1 * m + beta3 * (g / denom + weight_decay * p)
            p = p - lr * (m / bc1)
        else:  # moment_mode 1
            m = beta1 * m + beta3 * g
            p = p - lr * ((m / bc1) / denom + weight_decay * p)
    return p, m, gn ** 2 if norm_type == 2 else gn


CASES = [dict(), dict(weight_decay=0.1), dict(weight_decay=0.1, reg_inside_moment=True),
         dict(norm_type=0), dict(norm_type=0, weight_decay=0.1),
         dict(norm_type=0, weight_decay=0.1, reg_inside_moment=True), dict(reg_inside_moment=True),
         dict(grad_averaging=False), dict(init_zero=True), dict(norm_type=0, init_zero=True),
         dict(bias_correction=False), dict(norm_type=0, bias_correction=False, reg_inside_moment=True),
         dict(maximize=True, eps=1e-3)]
FP64_CASES = [CASES[1], CASES[2], CASES[4], CASES[5]]


def case_id(kw):
    return "-".join(f"{k}={v}" for k, v in kw.items()) or "default"


@pytest.mark.parametrize("kw,dtype", [(kw, torch.float32) for kw in CASES] + [(kw, torch.float64) for kw in FP64_CASES],
                         ids=[f"{case_id(kw)}-fp32" for kw in CASES] + [f"{case_id(kw)}-fp64" for kw in FP64_CASES])
def test_matches_the_formula_in_fp64(kw, dtype):
    params = make_params(dtype)
    start = [p.detach().clone() for p in params]
    grads = grads_for(params)
    opt = FusedNovoGrad(params, lr=LR, betas=BETAS, **kw)
    run(opt, params, grads)
    for i, (p, p0) in enumerate(zip(params, start)):
        want_p, want_m, want_v = apex_novograd(p0, [gs[i] for gs in grads], **kw)
        if dtype == torch.float64:
            torch.testing.assert_close(p.detach(), want_p, rtol=1e-12, atol=1e-12)
            continue
        state = opt.state[p]
        ulps_close(p.detach(), want_p.float())
        ulps_close(state["exp_avg"], want_m.float())
        torch.testing.assert_close(state["exp_avg_sq"].double(), torch.as_tensor(want_v, dtype=torch.float64),
                                   rtol=1e-5, atol=0)
        assert state["exp_avg_sq"].shape == () and state["exp_avg_sq"].dtype == torch.float32
        assert state["step"].item() == STEPS


def op_args(dtype, masters, seed=0, **kw):
    g = torch.Generator().manual_seed(seed)
    ps = [torch.randn(n, generator=g).to(dtype) for n in (1, 17, 16385, 40000)]
    ms = [p.float() for p in ps] if masters else []
    state = ([torch.zeros(p.shape) for p in ps], [torch.zeros(()) for _ in ps], [torch.zeros(()) for _ in ps])
    return ps, ms, state


def norms_of(grads, norm_type):
    if norm_type == 2:
        return core_ops.multi_tensor_l2norm(grads, per_tensor=True)[1]
    return torch.stack([g.abs().amax() for g in grads]).float()


@pytest.mark.parametrize("kw", [dict(), dict(reg_inside_moment=True, weight_decay=0.1), dict(weight_decay=0.1),
                                dict(init_zero=True, grad_averaging=False, bias_correction=False, maximize=True),
                                dict(norm_type=0, weight_decay=0.1),
                                dict(norm_type=0, reg_inside_moment=True, weight_decay=0.1, init_zero=True)],
                         ids=case_id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16-masters"])
def test_reference_matches_native_kernel(kw, dtype):
    """Same op, two kernels, same arguments (grad_scale and lr_tensor included): bitwise.
    Each gets its own grads: both write them back unscaled."""
    ours, theirs = op_args(dtype, dtype != torch.float32), op_args(dtype, dtype != torch.float32)
    full = dict(norm_type=2, weight_decay=0.0, bias_correction=True, reg_inside_moment=False,
                grad_averaging=True, init_zero=False, maximize=False) | kw
    g = torch.Generator().manual_seed(1)
    for _ in range(10):
        grads = [(torch.randn(p.shape, generator=g) * 64).to(dtype) for p in ours[0]]
        norms = norms_of(grads, full["norm_type"])
        for kernel, (ps, ms, (m, v, steps)) in ((op("fused_novograd_"), ours), (REF["fused_novograd_"], theirs)):
            kernel(ps, [g.clone() for g in grads], m, v, ms, steps, norms, full["norm_type"], 0.0, 0.95, 0.98, 1e-8,
                   full["weight_decay"], full["bias_correction"], full["reg_inside_moment"],
                   full["grad_averaging"], full["init_zero"], full["maximize"], torch.tensor([LR]),
                   torch.tensor([64.0]), None)
    for a, b in zip(ours[0] + ours[1] + ours[2][0] + ours[2][1], theirs[0] + theirs[1] + theirs[2][0] + theirs[2][1]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("norm_type", [2, 0])
def test_decoupled_momentum_is_of_the_raw_grad(norm_type):
    """reg_inside_moment=False: neither the layer norm nor the weight decay enters exp_avg."""
    params = make_params(sizes=(300, 7))
    grads = grads_for(params, steps=5)
    opt = FusedNovoGrad(params, lr=LR, betas=BETAS, weight_decay=0.1, norm_type=norm_type)
    run(opt, params, grads)
    beta1 = BETAS[0]
    for i, p in enumerate(params):
        m = torch.zeros_like(p)
        for gs in grads:
            m = m * beta1 + gs[i] * (1 - beta1)
        assert torch.equal(opt.state[p]["exp_avg"], m)


def test_the_moment_modes_differ_without_weight_decay_from_the_second_step():
    """Step 1 (m = 0) is the same in both modes, up to rounding; later steps are not, as
    the decoupled momentum mixes grads that other denominators will divide."""
    def final(steps, **kw):
        params = make_params(sizes=(300,))
        run(FusedNovoGrad(params, lr=LR, **kw), params, grads_for(params, steps=steps))
        return params[0].detach()

    ulps_close(final(1), final(1, reg_inside_moment=True), n=2)
    assert not torch.allclose(final(5), final(5, reg_inside_moment=True), rtol=1e-4, atol=0)


def assert_match(opt, params, ref, ref_params, param_ulps, state_ulps, param_key=None):
    """``opt`` over ``params`` against ``ref`` over ``ref_params``: params (or ``param_key``
    of the state), moments and steps; the second moments one value per tensor, on the
    params' device."""
    for a, c in zip(params, ref_params):
        sa, sc = opt.state[a], ref.state[c]
        ulps_close(sa[param_key] if param_key else a, sc[param_key] if param_key else c, param_ulps)
        ulps_close(sa["exp_avg"], sc["exp_avg"], state_ulps)
        assert sa["exp_avg_sq"].device == a.device and sa["exp_avg_sq"].numel() == 1
        # A sum of the grad's n squares, added in another order by each side (8 or 16
        # lanes, or torch's 4 on aarch64, then a tree or a walk): each lane's partial sum
        # of n / lanes terms carries a rounding walk of about sqrt(n / lanes) / 2 ulps;
        # sqrt(n) / 4 bounds it for every lane count (seen: 23 ulps at n = 131077 on the
        # x86-64 baseline and aarch64 levels, against torch's sum).
        ulps_close(sa["exp_avg_sq"], sc["exp_avg_sq"], max(state_ulps, math.ceil(math.sqrt(a.numel()) / 4)))
        assert sa["step"].device == a.device
        assert sa["step"].item() == sc["step"].item()


KERNEL_CASES = {  # (kwargs, grad_scale): 3, a rounding in every division
    "l2": (dict(lr=5e-2, betas=(0.95, 0.98), weight_decay=0.05), None),
    "max": (dict(lr=5e-2, betas=(0.95, 0.98), weight_decay=0.05, norm_type=0), None),
    "reg_inside": (dict(lr=5e-2, weight_decay=0.05, reg_inside_moment=True), None),
    "init_zero": (dict(lr=5e-2, init_zero=True, grad_averaging=False), None),
    "no_bc_maximize": (dict(lr=5e-2, bias_correction=False, maximize=True, norm_type=0), None),
    "l2_grad_scale": (dict(lr=5e-2, weight_decay=0.05), 3.0),
    "max_grad_scale": (dict(lr=5e-2, weight_decay=0.05, norm_type=0), 3.0),
}


@pytest.mark.parametrize("case", list(KERNEL_CASES))
@pytest.mark.parametrize("device", DEVICES)
def test_fp32_matches_the_kernels_below(device, case, monkeypatch):
    kw, grad_scale = KERNEL_CASES[case]
    (opt, ours), (ref, theirs) = runs_below(device, monkeypatch, lambda ps: FusedNovoGrad(ps, **kw),
                                            [core_ops.optimizers.fused_novograd, ops], grad_scale=grad_scale)
    assert_match(opt, ours, ref, theirs, *BELOW[device])
    assert all(opt.state[p]["step"].item() == STEPS for p in ours)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("device", DEVICES)
def test_max_norm_master_weights_follow_the_fp32_run(device, dtype):
    """With norm_type=0 (the L2 norm's: test_optimizer_device_contract.py), the masters of
    half params step as the float32 params of the same values (2 ulps: norms of half and
    float32 lists may be summed in another order; on a GPU the CUDA budget of BELOW), and
    on a GPU as the CPU kernel's masters (BELOW)."""
    kw = dict(lr=LR, weight_decay=0.01, norm_type=0)
    ours = make_params(dtype, sizes=DEVICE_SIZES, device=device)
    fp32 = clone_params(ours, torch.float32)
    grads = make_grads(sizes=DEVICE_SIZES, dtype=dtype)  # the fp32 run sees the same values
    opt, ref = FusedNovoGrad(ours, master_weights=True, **kw), FusedNovoGrad(fp32, **kw)
    run(opt, ours, grads)
    run(ref, fp32, grads, dtype=torch.float32)
    for a, b in zip(ours, fp32):
        master = opt.state[a]["master_param"]
        assert master.dtype == opt.state[a]["exp_avg"].dtype == opt.state[a]["exp_avg_sq"].dtype == torch.float32
        assert master.device == a.device
        ulps_close(master, b.detach(), 2 if device == "cpu" else BELOW[device][0])
        assert torch.equal(a.detach(), master.to(dtype))  # the param is the master, rounded
    if device != "cpu":
        cpu = [p.detach().cpu().requires_grad_() for p in make_params(dtype, sizes=DEVICE_SIZES)]
        on_cpu = FusedNovoGrad(cpu, master_weights=True, **kw)
        run(on_cpu, cpu, grads)
        assert_match(opt, ours, on_cpu, cpu, *BELOW[device], param_key="master_param")


@pytest.mark.parametrize("device", DEVICES)
def test_a_skipped_first_step_leaves_the_first_step_to_come(device):
    """Not even the fresh v_1 = ||g_1||^2 is taken from a skipped step."""
    a = make_params(sizes=(100,), device=device)
    b = clone_params(a)
    oa, ob = FusedNovoGrad(a, lr=LR), FusedNovoGrad(b, lr=LR)
    a[0].grad = torch.full((100,), 1e4, device=device)
    oa.step(found_inf=torch.ones(1, device=device))
    grads = make_grads(sizes=(100,), steps=3)
    run(oa, a, grads)
    run(ob, b, grads)
    assert torch.equal(a[0].detach(), b[0].detach())
    assert torch.equal(oa.state[a[0]]["exp_avg_sq"], ob.state[b[0]]["exp_avg_sq"])


@pytest.mark.parametrize("norm_type", [2, 0])
@pytest.mark.parametrize("device", DEVICES)
def test_grad_scale_divides_grads_and_norms_on_the_device(device, norm_type):
    sizes = (1000, 70000)
    a = make_params(sizes=sizes, device=device)
    b = clone_params(a)
    oa, ob = FusedNovoGrad(a, lr=LR, norm_type=norm_type), FusedNovoGrad(b, lr=LR, norm_type=norm_type)
    grads = make_grads(sizes=sizes, steps=3)
    run(oa, a, [[g * 1024 for g in gs] for gs in grads], grad_scale=torch.tensor([1024.0], device=device))
    run(ob, b, grads)
    for p, q in zip(a, b):
        assert torch.equal(p.detach(), q.detach())
        assert torch.equal(oa.state[p]["exp_avg_sq"], ob.state[q]["exp_avg_sq"])  # norms of unscaled grads
    assert torch.equal(a[1].grad.cpu(), grads[-1][1])  # written back unscaled, exactly (a power of two)


def test_max_grad_norm_is_the_step_on_clipped_grads():
    a = make_params(sizes=(300, 40))
    b = clone_params(a)
    oa, ob = FusedNovoGrad(a, lr=LR), FusedNovoGrad(b, lr=LR)
    for gs in grads_for(a, steps=4):
        for p, q, g in zip(a, b, gs):
            p.grad, q.grad = g * 3, g * 3
        oa.step(max_grad_norm=1.0)
        torch.nn.utils.clip_grad_norm_(b, 1.0)
        ob.step()
    for p, q in zip(a, b):
        ulps_close(p.detach(), q.detach(), n=16)  # the clip coefficient rounds differently


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16-masters"])
def test_state_dict_round_trip_is_exact(dtype):
    a = make_params(dtype, sizes=(129, 3))
    kw = dict(lr=LR, weight_decay=0.01, master_weights=dtype != torch.float32)
    opt = FusedNovoGrad(a, **kw)
    run(opt, a, grads_for(a, steps=3))
    sd = copy.deepcopy(opt.state_dict())
    b = clone_params(a)
    resumed = FusedNovoGrad(b, lr=1.0, master_weights=kw["master_weights"])  # the state dict's lr wins
    resumed.load_state_dict(sd)
    state = resumed.state[b[0]]
    assert state["exp_avg_sq"].dtype == torch.float32 and state["exp_avg_sq"].shape == ()
    assert resumed.param_groups[0]["lr"] == LR
    more = grads_for(a, steps=4, seed=9)
    run(opt, a, more)
    run(resumed, b, more)
    for p, q in zip(a, b):
        assert torch.equal(p, q)
        for key, value in opt.state[p].items():
            assert torch.equal(value, resumed.state[q][key]), key


def test_a_state_dict_with_per_element_exp_avg_sq_is_rejected_before_loading():
    a = make_params(sizes=(15,))
    src = FusedAdam(a, lr=1.0)  # exp_avg_sq per element, NovoGrad's is one value per tensor
    run(src, a, steps=1)
    b = clone_params(a)
    dst = FusedNovoGrad(b, lr=5e-4)
    with pytest.raises(ValueError, match="not from FusedNovoGrad"):
        dst.load_state_dict(src.state_dict())
    assert dst.param_groups[0]["lr"] == 5e-4 and not dst.state


def test_state_dict_of_another_optimizer_is_refused():
    a = make_params(sizes=(8,))
    adam = torch.optim.Adam(a)
    run(adam, a, grads_for(a, steps=1))
    with pytest.raises(ValueError, match="not from FusedNovoGrad"):
        FusedNovoGrad(a).load_state_dict(adam.state_dict())


def test_bad_input():
    p = torch.zeros(3, requires_grad=True)
    for kwargs, match in [(dict(amsgrad=True), "amsgrad"), (dict(norm_type=3), "norm_type"),
                          (dict(norm_type=1), "norm_type"), (dict(lr=-1.0), "lr"),
                          (dict(betas=(1.0, 0.9)), "betas"), (dict(betas=(0.9, -0.1)), "betas"),
                          (dict(eps=-1.0), "eps"), (dict(weight_decay=-0.1), "weight_decay")]:
        with pytest.raises(ValueError, match=match):
            FusedNovoGrad([p], **kwargs)
    opt = FusedNovoGrad([p])
    with pytest.raises(ValueError, match="norm_type"):  # a later group is checked when added
        opt.add_param_group({"params": [torch.zeros(2, requires_grad=True)], "norm_type": math.inf})
    assert len(opt.param_groups) == 1  # the rejected group was not added
    p.grad = torch.zeros(3).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        opt.step()
    with pytest.raises(ValueError, match="exp_avg_sqs"):
        op("fused_novograd_")([p.detach()], [torch.ones(3)], [torch.zeros(3)], [torch.zeros(3)], [],
                              [torch.zeros(())], torch.ones(1), 2, 0.1, 0.9, 0.9, 1e-8, 0.0, True, False,
                              True, False, False, None, None, None)
    for kernel in (op("fused_novograd_"), REF["fused_novograd_"]):
        with pytest.raises(ValueError, match="norm_type"):
            kernel([p.detach()], [torch.ones(3)], [torch.zeros(3)], [torch.zeros(())], [], [torch.zeros(())],
                   torch.ones(1), 1, 0.1, 0.9, 0.9, 1e-8, 0.0, True, False, True, False, False, None, None, None)


# ---- the op on a GPU: many tensors, odd memory, no host sync ----------------------

def op_lists(device, seed=0):
    """fused_novograd_'s lists for bf16 params with masters (optim_cases.many_shapes),
    step counts that differ per tensor (0: a fresh second moment), given grad norms."""
    g = torch.Generator().manual_seed(seed)
    shapes = many_shapes()
    lists = {k: [] for k in ("params", "grads", "exp_avgs", "exp_avg_sqs", "masters", "steps")}
    for i, shape in enumerate(shapes):
        p = torch.randn(shape, generator=g)
        lists["params"].append(place(p.to(torch.bfloat16), device))
        lists["masters"].append(place(p.clone(), device))
        lists["grads"].append(torch.randn(shape, generator=g).to(torch.bfloat16).to(device))
        lists["exp_avgs"].append(place(torch.randn(shape, generator=g) * 0.1, device))
        lists["exp_avg_sqs"].append(torch.rand((), generator=g).to(device))
        lists["steps"].append(torch.full((), float(i % 5), device=device))
    lists["norms"] = (torch.rand(len(shapes), generator=g) * 10).to(device)
    return lists


def call_op(lists, norm_type=2, **kw):
    op("fused_novograd_")(lists["params"], lists["grads"], lists["exp_avgs"], lists["exp_avg_sqs"],
                          lists["masters"], lists["steps"], lists["norms"], norm_type, 1e-2, 0.95, 0.98,
                          1e-8, 0.01, True, False, True, False, False, kw.get("lr_tensor"),
                          kw.get("grad_scale"), kw.get("found_inf"))


@pytest.mark.gpu
@pytest.mark.parametrize("norm_type", [2, 0])
def test_many_tensors_channels_last_lr_tensor_match_cpu(norm_type):
    gpu, cpu = op_on_gpu_and_cpu(op_lists, lambda lists, i, **kw: call_op(lists, norm_type, **kw))
    assert_lists_match(gpu, cpu, {"masters": BELOW["cuda"][0], "exp_avgs": BELOW["cuda"][0]})
    for a, c in zip(gpu["exp_avg_sqs"], cpu["exp_avg_sqs"]):
        ulps_close(a, c, 2)  # the same norms given: one blend in double, rounded once


@pytest.mark.gpu
def test_no_host_sync():
    assert_no_host_sync(op_lists("cuda"), call_op)


def test_opcheck(device):
    """fused_novograd_'s schema, fake kernel and dispatch (torch.library.opcheck)."""
    ts = [torch.randn(n, device=device) for n in (3, 17, 16385)]
    flag, one = torch.zeros(1, device=device), torch.ones(1, device=device)
    torch.library.opcheck(torch.ops.core_ops.fused_novograd_.default,
        ([t.clone() for t in ts], [torch.randn_like(t) for t in ts],
         [torch.zeros_like(t) for t in ts], [torch.zeros((), device=device) for _ in ts], [],
         [torch.zeros((), device=device) for _ in ts], torch.rand(len(ts), device=device) + 1,
         2, 1e-2, 0.95, 0.98, 1e-8, 0.01, True, False, True, False, False, None, one * 8.0,
         flag.clone()))
