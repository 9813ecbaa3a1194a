"""Helpers shared by the optimizer tests: the same params and grads on every device,
running an optimizer over them, snapshots of a step that must change nothing, and the
ulps comparisons of Note [Optimizer tolerances] and Note [CUDA optimizer tolerances]
(test_fused_adam.py). The lists of many tensors and the no-host-sync check serve the
CUDA cases of each optimizer's op."""

import contextlib
import copy

import pytest
import torch

from core_ops import native
from core_ops.reference import KERNELS as REF

STEPS = 20
SIZES = (1, 16, 17, 16383, 16385, 40000)
# With one tensor over three CUDA chunks (three blocks read one step count): the sizes
# of the tests that run on every device.
DEVICE_SIZES = (1, 16, 17, 16383, 16385, 2 * 65536 + 5, 40000)
# The device parametrization of the tests: the CUDA case is marked gpu, which
# tests/conftest.py skips, with its reason, on a machine without one.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def assert_native(device):
    """The native kernels of ``device`` are loaded, and on a GPU the CPU's too (the CUDA
    kernels are compared with them)."""
    for kind in dict.fromkeys(("cpu", device)):
        backend = native.ensure(kind)
        assert backend.native, backend.reason


@pytest.fixture(autouse=True)
def native_kernels(request):
    """Autouse in each test file that imports it: the native kernels of the test's
    ``device`` parameter (the CPU's in a test without one) are loaded."""
    callspec = getattr(request.node, "callspec", None)
    assert_native(callspec.params.get("device", "cpu") if callspec else "cpu")


def below(device, monkeypatch, *modules):
    """The device of the run that ``device``'s is compared with, the kernels one level
    down: on a GPU the CPU's native kernels; on the CPU the reference kernels
    (core_ops.reference), swapped in for the ``op`` of each of ``modules`` (so call it
    after the device's own run)."""
    if device == "cpu":
        for module in modules:
            monkeypatch.setattr(module, "op", lambda name: REF[name])
    return "cpu"


def runs_below(device, monkeypatch, make, modules, sizes=DEVICE_SIZES, steps=STEPS, grad_scale=None):
    """((optimizer, params) on ``device``, the same on the kernels below it: ``below``):
    ``make(params)`` run over the same float32 params and grads, given ``grad_scale``."""
    grads = make_grads(sizes=sizes, steps=steps)

    def one(where):
        params = make_params(sizes=sizes, device=where)
        opt = make(params)
        run(opt, params, grads, **({} if grad_scale is None else
                                   dict(grad_scale=torch.tensor([grad_scale], device=where))))
        return opt, params

    ours = one(device)
    return ours, one(below(device, monkeypatch, *modules))


def assert_like_the_kernels_below(device, monkeypatch, make, modules, param_ulps, state_ulps, **kwargs):
    """``runs_below``'s two runs agree: params within ``param_ulps``, every state tensor
    within ``state_ulps``, the step counts equal and on the params' device. Returns
    the device's (optimizer, params)."""
    (opt, ours), (ref, theirs) = runs_below(device, monkeypatch, make, modules, **kwargs)
    for a, c in zip(ours, theirs):
        ulps_close(a, c, param_ulps)
        assert opt.state[a].keys() == ref.state[c].keys()
        for key, value in opt.state[a].items():
            if key == "step":
                assert value.device == a.device and value.item() == ref.state[c][key].item()
            else:
                ulps_close(value, ref.state[c][key], state_ulps)
    return opt, ours


def torch_cases(cpu_cases, cuda_cases):
    """pytest params (device, kwargs, dtype) of a comparison with torch.optim: each CPU
    case in float32 and float64, each CUDA case in float32 (marked gpu)."""
    def label(kw):
        return "-".join(f"{k}={v}" for k, v in kw.items() if k != "lr") or "plain"
    return ([pytest.param("cpu", kw, dtype, id=f"cpu-{label(kw)}-{str(dtype)[6:]}")
             for kw in cpu_cases for dtype in (torch.float32, torch.float64)] +
            [pytest.param("cuda", kw, torch.float32, id=f"cuda-{label(kw)}-float32", marks=pytest.mark.gpu)
             for kw in cuda_cases])


# Against torch.optim on each device, in float32 ulps of the largest |expected| after
# STEPS steps: (a param, a state tensor). The CPU: Note [Optimizer tolerances]; CUDA,
# where torch rounds its own way (add with alpha, mul_ then add_, addcmul_): at most one
# rounding of a value per step with a random sign (Note [CUDA optimizer tolerances]).
TORCH_ULPS = {"cpu": (8, 8), "cuda": (20, 8)}


def assert_runs_as_torch(device, dtype, ours, theirs, state_keys):
    """``ours(params)`` and ``theirs(params)`` (torch.optim) over the same params and
    grads on ``device`` end within TORCH_ULPS (float64: 1e-12 relative), their state
    under ``state_keys`` too, with the same step counts."""
    params = make_params(dtype, sizes=DEVICE_SIZES, device=device)
    twins = clone_params(params)
    grads = make_grads(sizes=DEVICE_SIZES)
    opt, ref = ours(params), theirs(twins)
    run(opt, params, grads)
    run(ref, twins, grads)
    param_ulps, state_ulps = TORCH_ULPS[device]
    for a, b in zip(params, twins):
        pairs = [(a, b, param_ulps)] + [(opt.state[a][k], ref.state[b][k], state_ulps) for k in state_keys]
        for x, y, n in pairs:
            if dtype == torch.float64:
                torch.testing.assert_close(x.detach(), y.detach(), rtol=1e-12, atol=1e-12)
            else:
                ulps_close(x, y, n)
        if "step" in ref.state[b]:
            assert opt.state[a]["step"].device == a.device
            assert opt.state[a]["step"].item() == ref.state[b]["step"].item() == STEPS


def ulps_close(actual, expected, n=8):
    """|actual - expected| <= n ulps (of expected's dtype) of the largest |expected|."""
    eps = torch.finfo(expected.dtype).eps
    actual, expected = actual.detach().cpu().double(), expected.detach().cpu().double()
    scale = expected.abs().max().item() if expected.numel() else 1.0
    torch.testing.assert_close(actual, expected, rtol=0, atol=n * eps * max(scale, 1e-30))


def make_params(dtype=torch.float32, seed=0, sizes=SIZES, device="cpu"):
    """The same values on every device: drawn on the CPU, then moved."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g).to(dtype).to(device).requires_grad_() for n in sizes]


def clone_params(ps, dtype=None):
    return [p.detach().clone().to(dtype or p.dtype).requires_grad_() for p in ps]


def make_grads(sizes=SIZES, steps=STEPS, seed=1, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(n, generator=g).to(dtype) for n in sizes] for _ in range(steps)]


def run(opt, params, grads=None, steps=STEPS, seed=1, dtype=None, **step_kwargs):
    """``steps`` steps of ``opt`` on ``grads`` (one list a step, copied to each param's
    device and dtype, or ``dtype``: a step writes its grads back unscaled and clipped, and
    ``grads`` may feed another run), by default drawn from ``seed``."""
    if grads is None:
        grads = make_grads([p.numel() for p in params], steps, seed)
    for step_grads in grads:
        for p, grad in zip(params, step_grads):
            p.grad = grad.reshape(p.shape).to(device=p.device, dtype=dtype or p.dtype, copy=True)
        opt.step(**step_kwargs)


def snapshot(opt, params):
    return [p.detach().clone() for p in params], copy.deepcopy(opt.state_dict())


def assert_unchanged(before, opt, params):
    """Params and every state tensor (steps and master_param included) as ``before``."""
    ps, sd = before
    assert all(torch.equal(a, b.detach()) for a, b in zip(ps, params))
    now = opt.state_dict()
    for k, st in sd["state"].items():
        for key, value in st.items():
            assert torch.equal(value, now["state"][k][key]), key


def assert_same_run(make_ours, make_theirs, dtype=torch.float32, n=8, steps=STEPS):
    """Both optimizers from the same params and grads end within n ulps."""
    ours = make_params(dtype)
    theirs = clone_params(ours)
    run(make_ours(ours), ours, steps=steps)
    run(make_theirs(theirs), theirs, steps=steps)
    for a, b in zip(ours, theirs):
        if dtype == torch.float64:
            torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-12, atol=1e-12)
        else:
            ulps_close(a.detach(), b.detach(), n)


def assert_state_dict_round_trip(make_ours, make_theirs):
    """torch -> ours and ours -> torch, each continuing with the same results."""
    for first, second in ((make_theirs, make_ours), (make_ours, make_theirs)):
        a = make_params(sizes=(64, 7))
        src = first(a)
        run(src, a, steps=4)
        b = clone_params(a)
        dst = second(b)
        dst.load_state_dict(copy.deepcopy(src.state_dict()))
        run(src, a, steps=4, seed=7)
        run(dst, b, steps=4, seed=7)
        for p, q in zip(a, b):
            ulps_close(q.detach(), p.detach())


# ---- an op's lists on the GPU against the same lists on the CPU ---------------------

def many_shapes(n_small=300):
    """More small tensors than one launch holds, one over several CUDA chunks, one 4-d
    (laid out channels_last by ``place``)."""
    return [(1 + (i * 37) % 300,) for i in range(n_small)] + [(3 * 65536 + 7,), (2, 3, 5, 7)]


def place(t, device):
    t = t.to(device)
    return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t


def flat(ts):
    """One CPU vector of a list's values: one magnitude for the whole list, as a small
    tensor alone may cancel to ~0."""
    return torch.cat([t.detach().reshape(-1).cpu() for t in ts])


@contextlib.contextmanager
def no_host_sync():
    """Any call inside that synchronizes the host with the GPU raises."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(0)


def device_scalars(device):
    """lr_tensor, grad_scale and found_inf as the ops take them, on ``device``."""
    return dict(lr_tensor=torch.full((1,), 1e-2, device=device), grad_scale=torch.ones(1, device=device),
                found_inf=torch.zeros(1, device=device))


def assert_no_host_sync(lists, call_op):
    """``call_op(lists, **scalars)`` on the GPU never syncs the host."""
    with no_host_sync():
        call_op(lists, **device_scalars("cuda"))


def op_on_gpu_and_cpu(op_lists, call_op, calls=3):
    """The lists ``op_lists(device)`` makes, on the GPU and on the CPU, after ``calls``
    calls ``call_op(lists, i, **scalars)``: a float64 lr tensor, a grad_scale of 3 (a
    rounding in every division), an int32 found_inf left clear."""
    out = []
    for device in ("cuda", "cpu"):
        lists = op_lists(device)
        for i in range(calls):
            call_op(lists, i, lr_tensor=torch.tensor([2e-2], dtype=torch.float64, device=device),
                    grad_scale=torch.tensor([3.0], device=device),
                    found_inf=torch.zeros(1, dtype=torch.int32, device=device))
        out.append(lists)
    return out


def assert_lists_match(gpu, cpu, ulps):
    """The lists of ``op_on_gpu_and_cpu``: each of ``ulps`` (key: n) within n ulps of the
    CPU's, laid out as the CPU's; the bfloat16 params their masters, rounded; the step
    counts, where there are any, the CPU's."""
    for key, n in ulps.items():
        assert all(a.stride() == c.stride() for a, c in zip(gpu[key], cpu[key])), key
        ulps_close(flat(gpu[key]), flat(cpu[key]), n)
    for a, m in zip(gpu["params"], gpu["masters"]):
        assert torch.equal(a, m.to(torch.bfloat16))
    if "steps" in gpu:
        assert [s.item() for s in gpu["steps"]] == [s.item() for s in cpu["steps"]]
