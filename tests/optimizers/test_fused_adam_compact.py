"""FusedAdam with compact state: master_weights="remainder" and state_dtype bfloat16 /
"int8" (core_ops/optimizers/compact_state.py): the native kernel of
fused_adam_compact_ on each device against the one below it (on the CPU the
reference, on a GPU the CPU kernel), for every state layout, and FusedAdam with
compact state against FusedAdam with fp32 masters and fp32 state. The registry's
"adam-compact" entry runs it through the generic tests.

Tolerances: the native kernels and the reference agree bit for bit (one math, each +
and * rounded once, the same float32 decision points for codes; the codes are the same
count of midpoints, found by a table on the CPU and a binary search on the GPU).
Remainders against fp32 masters: params bit for bit every step; masters too, but where
an update landed exactly on a rounding tie (Note [Master remainders]): there one
float32 ulp.
"""

import copy

import pytest
import torch
from optim_cases import DEVICES, make_params
from optim_cases import native_kernels  # noqa: F401  (autouse)

import core_ops  # noqa: F401
from core_ops._schemas import op
from core_ops.optimizers import FusedAdam
from core_ops.optimizers.compact_state import full_precision_state_dict
from core_ops.reference import KERNELS as REF
from core_ops.reference.compact_state import BLOCK, dequantize, dynamic_map, join_master, quantize

# Straddling a block of 8-bit moments and a CPU chunk (16384); under 4096 elements a
# tensor keeps float32 moments under "int8". On a GPU: a block and a CUDA chunk.
SIZES = (1, 255, 4096, 4097, 16383, 16385, 40000)
SIZES_ON = {"cpu": SIZES, "cuda": (1, 255, 256, 257, 4097, 65535, 2 * 65536 + 5)}
HYPER = dict(lr=2e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05)


def grads_for(params, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(p.shape, generator=g).to(p.dtype) for p in params] for _ in range(steps)]


def stepped(opt, params, grads, **step_kwargs):
    """Params after each step."""
    seen = []
    for step_grads in grads:
        for p, grad in zip(params, step_grads):
            p.grad = grad.clone()
        opt.step(**step_kwargs)
        seen.append([p.detach().clone() for p in params])
    return seen


def bf16_params(seed=0, sizes=SIZES):
    # Magnitudes from 1e-30 to 1e3 (subnormal-adjacent to large) and a few exact zeros.
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in sizes:
        x = torch.randn(n, generator=g) * 10.0 ** torch.randint(-30, 4, (n,), generator=g).float()
        x[::97] = 0.0
        out.append(x.bfloat16().requires_grad_())
    return out


def clone(ps):
    return [p.detach().clone().requires_grad_() for p in ps]


def equal_bits(a, b):
    return torch.equal(a.view(torch.int16), b.view(torch.int16)) if a.dtype == torch.bfloat16 else torch.equal(a, b)


# ---- kernel against reference -------------------------------------------------------

def compact_lists(moments, weights, param_dtype, sizes=SIZES, channels_last=False, seed=3):
    g = torch.Generator().manual_seed(seed)
    shape = (lambda n: (1, 1, 1, n)) if not channels_last else (lambda n: (1, n, 1, 1))

    def t(x):
        x = x.reshape(shape(x.numel()))
        return x.contiguous(memory_format=torch.channels_last) if channels_last else x

    ps = [t(torch.randn(n, generator=g).to(param_dtype)) for n in sizes]
    gs = [t(torch.randn(n, generator=g).to(param_dtype)) for n in sizes]
    m_raw = [torch.randn(n, generator=g) * 0.1 for n in sizes]
    v_raw = [torch.rand(n, generator=g) * 0.01 for n in sizes]
    if moments == "int8":
        ms, ma = zip(*[quantize(x, dynamic_map(True)) for x in m_raw])
        vs, va = zip(*[quantize(x, dynamic_map(False)) for x in v_raw])
        ms, vs, ma, va = [t(c) for c in ms], [t(c) for c in vs], list(ma), list(va)
    else:
        dtype = torch.float32 if moments == "float32" else torch.bfloat16
        ms, vs, ma, va = [t(x.to(dtype)) for x in m_raw], [t(x.to(dtype)) for x in v_raw], [], []
    if weights == "remainder":
        mp = [t(torch.randint(-0x7FFF, 0x7FFF, (n,), generator=g, dtype=torch.int16)) for n in sizes]
    elif weights == "master":
        mp = [p.float() + t(torch.randn(n, generator=g)) * 1e-3 for p, n in zip(ps, sizes)]
    else:
        mp = []
    steps = [torch.tensor(float(i)) for i in range(len(sizes))]
    return [ps, gs, ms, vs, ma, va, mp, steps]


def on(lists, device):
    return [[t.to(device) for t in ts] for ts in lists]


@pytest.mark.parametrize("moments", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("weights,param_dtype", [("remainder", torch.bfloat16), ("master", torch.float16),
                                                 ("master", torch.bfloat16), ("none", torch.float32),
                                                 ("none", torch.bfloat16)],
                         ids=["remainder", "fp16-master", "bf16-master", "fp32", "bf16"])
@pytest.mark.parametrize("scaled", [False, True], ids=["", "grad_scale"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["", "channels_last"])
@pytest.mark.parametrize("device", DEVICES)
def test_native_kernel_is_the_one_below_bit_for_bit(device, moments, weights, param_dtype, scaled, channels_last):
    """On the CPU the native kernel against the reference; on a GPU the CUDA kernel
    against the CPU's."""
    lists = compact_lists(moments, weights, param_dtype, sizes=SIZES_ON[device], channels_last=channels_last)
    ours, below = on(lists, device), copy.deepcopy(lists)
    kernels = ((op("fused_adam_compact_"), ours, device),
               (REF["fused_adam_compact_"] if device == "cpu" else op("fused_adam_compact_"), below, "cpu"))
    for kernel, ls, where in kernels:
        maps = (dynamic_map(True).to(where), dynamic_map(False).to(where)) if moments == "int8" else (None, None)
        grad_scale = torch.tensor([8.0], device=where) if scaled else None
        for _ in range(3):
            kernel(*ls, *maps, 1e-2, 0.9, 0.999, 1e-8, 0.01, True, True, False, None, grad_scale, None)
    for name, a_list, b_list in zip(("params", "grads", "exp_avgs", "exp_avg_sqs", "exp_avg_absmaxes",
                                     "exp_avg_sq_absmaxes", "master_params", "steps"), ours, below):
        for i, (a, b) in enumerate(zip(a_list, b_list)):
            assert a.dtype == b.dtype and a.stride() == b.stride(), (name, i)
            assert equal_bits(a.cpu(), b), (name, i)


@pytest.mark.parametrize("device", DEVICES)
def test_skipped_step_changes_nothing(device):
    lists = on(compact_lists("int8", "remainder", torch.bfloat16, sizes=SIZES_ON[device]), device)
    before = copy.deepcopy(lists)
    maps = dynamic_map(True).to(device), dynamic_map(False).to(device)
    op("fused_adam_compact_")(*lists, *maps, 1e-2, 0.9, 0.999, 1e-8, 0.01, True, True, False, None,
                              torch.tensor([4.0], device=device), torch.ones(1, device=device))
    for a_list, b_list in zip(lists, before):
        assert all(equal_bits(a, b) for a, b in zip(a_list, b_list))


# ---- remainders are fp32 masters ------------------------------------------------------

def master_gaps(opt_master, masters, opt_remainder, params):
    """(elements whose fp32 master and param + remainder differ, the largest difference
    in float32 ulps of the tensor's largest |master|)."""
    differing, worst = 0, 0.0
    for a, p in zip(masters, params):
        m = opt_master.state[a]["master_param"]
        joined = join_master(p.detach(), opt_remainder.state[p]["master_remainder"])
        differing += int((m != joined).sum())
        worst = max(worst, float((m - joined).abs().max() / (m.abs().max() * torch.finfo(torch.float32).eps)))
    return differing, worst


@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "scaled-clipped"])
@pytest.mark.parametrize("adam_w_mode", [True, False], ids=["adamw", "adam"])
@pytest.mark.parametrize("device", DEVICES)
def test_remainders_step_as_fp32_masters_bit_for_bit(device, adam_w_mode, scaled):
    step_kwargs = dict(grad_scale=torch.tensor([1024.0], device=device), max_grad_norm=50.0) if scaled else {}
    params = [p.detach().to(device).requires_grad_() for p in bf16_params(sizes=SIZES_ON[device])]
    ref, ours, eight_bit = clone(params), clone(params), clone(params)
    grads = [[g.to(device) for g in gs] for gs in grads_for(params, 60)]
    if scaled:
        grads = [[g * 1024 for g in gs] for gs in grads]
    a = FusedAdam(ref, master_weights=True, adam_w_mode=adam_w_mode, **HYPER)
    b = FusedAdam(ours, master_weights="remainder", adam_w_mode=adam_w_mode, **HYPER)
    for step, (x, y) in enumerate(zip(stepped(a, ref, grads, **step_kwargs), stepped(b, ours, grads, **step_kwargs))):
        assert all(equal_bits(p, q) for p, q in zip(x, y)), step
    # The masters part only where an update landed on a rounding tie (about one element in
    # 65536 a step: ~0.1% of elements over 60 steps) and by a few ulps of the tensor's
    # scale (one ulp at the tie, carried by the later updates).
    differing, worst = master_gaps(a, ref, b, ours)
    assert differing <= 0.002 * sum(p.numel() for p in params) and worst <= 4, (differing, worst)
    assert "master_param" not in b.state[ours[0]]
    # With 8-bit moments too, on the tensors of 4096 elements and more.
    c = FusedAdam(eight_bit, master_weights="remainder", state_dtype="int8", adam_w_mode=adam_w_mode, **HYPER)
    stepped(c, eight_bit, grads[:3], **step_kwargs)
    assert c.state[eight_bit[-1]]["exp_avg"].dtype == torch.uint8


def test_remainders_on_the_reference_kernel_too(monkeypatch):
    params = bf16_params(sizes=(300, 5000))
    ref, ours = clone(params), clone(params)
    grads = grads_for(params, 30)
    monkeypatch.setattr(torch.ops.core_ops, "fused_adam_compact_",
                        type("Ref", (), {"default": staticmethod(REF["fused_adam_compact_"])})())
    a = FusedAdam(ref, master_weights=True, **HYPER)
    b = FusedAdam(ours, master_weights="remainder", **HYPER)
    for x, y in zip(stepped(a, ref, grads), stepped(b, ours, grads)):
        assert all(equal_bits(p, q) for p, q in zip(x, y))


def test_float32_params_among_remainders_are_their_own_masters():
    params = [torch.randn(5000).bfloat16().requires_grad_(), torch.randn(64).requires_grad_()]
    opt = FusedAdam(params, master_weights="remainder", **HYPER)
    stepped(opt, params, grads_for(params, 2))
    assert opt.state[params[0]]["master_remainder"].dtype == torch.int16
    assert "master_remainder" not in opt.state[params[1]] and "master_param" not in opt.state[params[1]]


def test_a_written_param_restarts_from_its_written_value():
    p = torch.randn(5000).bfloat16().requires_grad_()
    opt = FusedAdam([p], master_weights="remainder", **HYPER)
    stepped(opt, [p], grads_for([p], 3))
    assert opt.state[p]["master_remainder"].abs().sum() > 0
    with torch.no_grad():
        p.clamp_(-0.5, 0.5)
    twin = p.detach().clone().requires_grad_()
    fresh = FusedAdam([twin], master_weights=True, **HYPER)
    fresh.load_state_dict(opt.state_dict())  # moments and steps; the master from the written param
    fresh.state[twin]["master_param"] = twin.detach().float()
    grads = grads_for([p], 2, seed=9)
    assert all(equal_bits(x[0], y[0]) for x, y in zip(stepped(opt, [p], grads), stepped(fresh, [twin], grads)))


# ---- compact moments -------------------------------------------------------------

def test_moment_layouts_and_bytes_per_param():
    params = [torch.zeros(1 << 16, dtype=torch.bfloat16, requires_grad=True), torch.zeros(100, requires_grad=True)]
    per_param = {}
    for name, kw in (("fp32 masters", dict(master_weights=True)),
                     ("remainder + bf16", dict(master_weights="remainder", state_dtype=torch.bfloat16)),
                     ("remainder + int8", dict(master_weights="remainder", state_dtype="int8"))):
        opt = FusedAdam(params[:1], **kw)
        stepped(opt, params[:1], grads_for(params[:1], 1))
        state = opt.state[params[0]]
        n = params[0].numel()
        per_param[name] = (2 * n + sum(t.numel() * t.element_size() for k, t in state.items() if k != "step")) / n
    assert per_param["fp32 masters"] == 14.0
    assert per_param["remainder + bf16"] == 8.0
    assert per_param["remainder + int8"] == pytest.approx(6.0 + 8 / BLOCK)
    opt = FusedAdam(params[1:], state_dtype="int8")
    stepped(opt, params[1:], grads_for(params[1:], 1))
    assert opt.state[params[1]]["exp_avg"].dtype == torch.float32  # under 4096 elements


@pytest.mark.parametrize("state_dtype,rtol", [(torch.bfloat16, 0.01), ("int8", 0.05)], ids=["bf16", "int8"])
def test_compact_moments_track_fp32_moments(state_dtype, rtol):
    params = make_params(torch.float32, sizes=(8192, 20000))
    ref, ours = clone(params), clone(params)
    grads = grads_for(params, 40)
    a = FusedAdam(ref, **HYPER)
    b = FusedAdam(ours, state_dtype=state_dtype, **HYPER)
    stepped(a, ref, grads), stepped(b, ours, grads)
    full = full_precision_state_dict(b.state_dict())["state"]
    for i, (p, q) in enumerate(zip(ref, ours)):
        moved = (p.detach() - params[i].detach()).norm()
        assert (p.detach() - q.detach()).norm() <= rtol * moved
        for key in ("exp_avg", "exp_avg_sq"):
            full_key = full[i][key]
            assert (full_key - a.state[p][key]).norm() <= rtol * a.state[p][key].norm()


def test_overflow_skip_leaves_compact_state_untouched():
    params = bf16_params(sizes=(5000, 300))
    opt = FusedAdam(params, master_weights="remainder", state_dtype="int8", **HYPER)
    stepped(opt, params, grads_for(params, 2))
    before = copy.deepcopy(opt.state_dict()), [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.full_like(p, float("inf"))
    found_inf = torch.zeros(1)
    opt.step(grad_scale=torch.tensor([2.0]), found_inf=found_inf, max_grad_norm=1.0)
    assert found_inf.item() == 1.0
    assert all(equal_bits(a, b.detach()) for a, b in zip(before[1], params))
    for k, saved in before[0]["state"].items():
        for key, value in saved.items():
            assert torch.equal(value, opt.state_dict()["state"][k][key]), key


def test_grad_scaler_drives_compact_state_as_fp32_masters():
    params = bf16_params(sizes=(5000,))
    ref, ours = clone(params), clone(params)
    grads = grads_for(params, 10)
    results = []
    for ps, kw in ((ref, dict(master_weights=True)), (ours, dict(master_weights="remainder"))):
        opt = FusedAdam(ps, **kw, **HYPER)
        scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
        for step_grads in grads:
            scaler.scale(torch.ones(()))  # as a loss would: the scaler's scale tensor
            for p, grad in zip(ps, step_grads):
                p.grad = grad * 256.0
            scaler.step(opt)
            scaler.update()
        results.append(ps[0].detach().clone())
    assert equal_bits(*results)


# ---- state dicts -----------------------------------------------------------------

@pytest.mark.parametrize("kw", [dict(master_weights="remainder", state_dtype="int8"),
                                dict(master_weights="remainder", state_dtype=torch.bfloat16),
                                dict(master_weights=True, state_dtype="int8")], ids=["rem-int8", "rem-bf16", "fp32m-int8"])
def test_state_dict_round_trips_and_resumes_bit_for_bit(kw, tmp_path):
    params = bf16_params(sizes=(5000, 300))
    straight, resumed = clone(params), clone(params)
    grads = grads_for(params, 12)
    a = FusedAdam(straight, **kw, **HYPER)
    stepped(a, straight, grads)
    b = FusedAdam(resumed, **kw, **HYPER)
    stepped(b, resumed, grads[:5])
    torch.save(b.state_dict(), tmp_path / "opt.pt")
    c = FusedAdam(resumed, **kw, **HYPER)
    c.load_state_dict(torch.load(tmp_path / "opt.pt"))
    saved, loaded = torch.load(tmp_path / "opt.pt"), c.state_dict()
    for k in saved["state"]:
        for key, value in saved["state"][k].items():
            assert value.dtype == loaded["state"][k][key].dtype and torch.equal(value, loaded["state"][k][key]), key
    stepped(c, resumed, grads[5:])
    assert all(equal_bits(x.detach(), y.detach()) for x, y in zip(straight, resumed))


def test_torch_adamw_state_loads_quantized_and_comes_back():
    params = make_params(torch.float32, sizes=(5000, 300))
    theirs, ours = clone(params), clone(params)
    grads = grads_for(params, 5)
    torch_opt = torch.optim.AdamW(theirs, **HYPER)
    stepped(torch_opt, theirs, grads)
    opt = FusedAdam(ours, state_dtype="int8", **HYPER)
    opt.load_state_dict(torch_opt.state_dict())
    big = opt.state[ours[0]]
    assert big["exp_avg"].dtype == torch.uint8 and big["exp_avg_absmax"].shape == (20,)
    assert opt.state[ours[1]]["exp_avg"].dtype == torch.float32  # small: kept float32
    back = full_precision_state_dict(opt.state_dict())
    expected = torch_opt.state[theirs[0]]
    for key, qmap in (("exp_avg", dynamic_map(True)), ("exp_avg_sq", dynamic_map(False))):
        codes, absmax = quantize(expected[key].reshape(-1), qmap)
        assert torch.equal(back["state"][0][key], dequantize(codes, absmax, qmap))  # quantized once, exactly
    again = torch.optim.AdamW(clone(params), **HYPER)
    again.load_state_dict(back)  # torch takes it as its own
    assert again.state_dict()["state"][0]["exp_avg"].dtype == torch.float32


def test_compact_state_loads_into_fp32_fused_adam():
    params = bf16_params(sizes=(5000,))
    ours = clone(params)
    opt = FusedAdam(ours, master_weights="remainder", state_dtype="int8", **HYPER)
    stepped(opt, ours, grads_for(params, 3))
    full = FusedAdam(ours, master_weights=True, **HYPER)
    full.load_state_dict(opt.state_dict())
    state = full.state[ours[0]]
    assert state["exp_avg"].dtype == torch.float32 and "exp_avg_absmax" not in state
    assert torch.equal(state["master_param"], join_master(ours[0].detach(), opt.state[ours[0]]["master_remainder"]))
    # ... and back: fp32 masters become the same remainders; the moments are coded
    # again, within one quantization step of the block maximum (not always the same
    # codes: a block whose largest magnitude is negative decodes it as -0.993 of it).
    again = FusedAdam(ours, master_weights="remainder", state_dtype="int8", **HYPER)
    again.load_state_dict(full.state_dict())
    assert torch.equal(again.state[ours[0]]["master_remainder"], opt.state[ours[0]]["master_remainder"])
    back = full_precision_state_dict(again.state_dict())["state"][0]
    for key in ("exp_avg", "exp_avg_sq"):
        scale = opt.state[ours[0]][f"{key}_absmax"].repeat_interleave(BLOCK)[:5000]
        assert bool(((back[key] - state[key]).abs() <= 0.015 * scale).all()), key


# ---- bad input -------------------------------------------------------------------

def test_unknown_state_dtype_is_refused():
    with pytest.raises(ValueError, match='state_dtype must be torch.float32, torch.bfloat16 or "int8"'):
        FusedAdam([torch.zeros(3, requires_grad=True)], state_dtype=torch.float16)
    with pytest.raises(ValueError, match="master_weights must be True, False or \"remainder\""):
        FusedAdam([torch.zeros(3, requires_grad=True)], master_weights="half")


def test_remainder_on_fp16_params_names_master_weights_true_before_any_update():
    first = torch.zeros(8, dtype=torch.bfloat16, requires_grad=True)
    p = torch.zeros(8, dtype=torch.float16, requires_grad=True)
    opt = FusedAdam([{"params": [first]}, {"params": [p]}], master_weights="remainder")
    first.grad, p.grad = torch.ones_like(first), torch.ones_like(p)
    with pytest.raises(TypeError, match=r"param_groups\[1\]\['params'\]\[0\].*Use master_weights=True for "
                                        "float16 params"):
        opt.step()
    assert not first.detach().any() and not p.detach().any() and not opt.state[first] and not opt.state[p]


def test_remainders_with_only_float32_params_are_refused():
    p = torch.zeros(8, requires_grad=True)
    opt = FusedAdam([p], master_weights="remainder")
    p.grad = torch.ones_like(p)
    with pytest.raises(TypeError, match="cast the model to bfloat16 first .* or use master_weights=False"):
        opt.step()
    assert torch.equal(p.detach(), torch.zeros(8)) and not opt.state[p]


def test_remainders_for_other_optimizers_are_refused():
    from core_ops.optimizers import FusedSGD
    with pytest.raises(ValueError, match='master_weights="remainder" is for FusedAdam'):
        FusedSGD([torch.zeros(3, requires_grad=True)], lr=0.1, master_weights="remainder")


def test_amsgrad_with_compact_state_is_refused():
    with pytest.raises(ValueError, match="amsgrad=True keeps a third moment"):
        FusedAdam([torch.zeros(3, requires_grad=True)], amsgrad=True, state_dtype="int8")


def test_state_dict_of_another_block_size_is_refused_and_changes_nothing():
    params = make_params(torch.float32, sizes=(5000,))
    opt = FusedAdam(params, state_dtype="int8", **HYPER)
    stepped(opt, params, grads_for(params, 2))
    sd = opt.state_dict()
    before = copy.deepcopy(sd)
    other = copy.deepcopy(sd)
    other["state"][0]["exp_avg_absmax"] = torch.ones(5000 // 64 + 1)  # blocks of 64
    with pytest.raises(ValueError, match="saved with another block size"):
        opt.load_state_dict(other)
    now = opt.state_dict()
    for key, value in before["state"][0].items():
        assert torch.equal(value, now["state"][0][key])


def test_remainder_of_another_shape_is_refused():
    params = bf16_params(sizes=(5000,))
    opt = FusedAdam(params, master_weights="remainder", **HYPER)
    stepped(opt, params, grads_for(params, 1))
    sd = opt.state_dict()
    sd["state"][0]["master_remainder"] = torch.zeros(10, dtype=torch.int16)
    with pytest.raises(ValueError, match="master_remainder"):
        opt.load_state_dict(sd)


def test_kernel_names_bad_lists():
    lists = compact_lists("int8", "remainder", torch.bfloat16, sizes=(300,))
    maps = dynamic_map(True), dynamic_map(False)
    args = (1e-2, 0.9, 0.999, 1e-8, 0.0, True, True, False, None, None, None)
    for kernel in (op("fused_adam_compact_"), REF["fused_adam_compact_"]):
        bad = copy.deepcopy(lists)
        bad[4] = [torch.zeros(7)]
        with pytest.raises(ValueError, match="exp_avg_absmaxes\\[0\\] must be a contiguous float32 tensor of 2"):
            kernel(*bad, *maps, *args)
        with pytest.raises(ValueError, match="exp_avg_map must be a contiguous float32 tensor of 256"):
            kernel(*copy.deepcopy(lists), None, maps[1], *args)
        bad = copy.deepcopy(lists)
        bad[0] = [p.half() for p in bad[0]]
        bad[1] = [g.half() for g in bad[1]]
        with pytest.raises(TypeError, match="int16 remainders are for bfloat16 params"):
            kernel(*bad, *maps, *args)
