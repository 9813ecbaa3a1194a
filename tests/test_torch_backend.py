"""Note [Torch's fused kernels] (core_ops/torch_fused.py): where no native kernel is loaded, an op
whose math torch has as a fused kernel runs on torch's, when the call fits it, and on
the reference otherwise. Its kernels are called here directly against the reference
(the specification), in the tolerances the optimizer tests state (Note [Optimizer
tolerances]: 8 ulps of the largest |param| after 20 steps; torch's fused Adam forms
its moments with fused multiply-adds and float32 betas, a few ulps); then a process
that cannot compile (CXX=/bin/false, a fresh cache) reports and uses backends 3 and 4."""

import copy
import os
import subprocess
import sys

import pytest
import torch

from core_ops import torch_fused
from core_ops.reference import KERNELS as REF

TORCH = torch_fused.KERNELS
SIZES = (1, 16, 17, 16385, 40000)
STEPS = 20


@pytest.fixture
def torch_calls(monkeypatch):
    """Counts the calls of torch's fused kernels, so a call that fell back to the
    reference by mistake fails."""
    calls = {}
    for name in ("_fused_adam_", "_fused_adamw_", "_fused_sgd_", "_fused_adagrad_",
                 "_amp_foreach_non_finite_check_and_unscale_", "_foreach_norm"):
        original = getattr(torch, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            calls[_name] = calls.get(_name, 0) + 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(torch, name, counted)
    return calls


def ulps_close(actual, expected, n=8):
    scale = expected.abs().max().item() if expected.numel() else 1.0
    tol = n * torch.finfo(expected.dtype).eps * max(scale, 1e-30)
    torch.testing.assert_close(actual, expected, rtol=0, atol=tol)


def adam_lists(dtype=torch.float32, amsgrad=True, masters=False):
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(n, generator=g).to(dtype) for n in SIZES]
    state = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    z = lambda: [torch.zeros(n, dtype=state) for n in SIZES]  # noqa: E731
    return dict(params=params, exp_avgs=z(), exp_avg_sqs=z(), maxes=z() if amsgrad else [],
                masters=[p.to(torch.float32) for p in params] if masters else [],
                steps=[torch.zeros(()) for _ in SIZES])


def adam_step(kernel, lists, seed, grad_scale=None, found_inf=None, lr_tensor=None, adam_w_mode=True,
              bias_correction=True, amsgrad=True, maximize=False, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    grads = [(torch.randn(p.shape, generator=g) * scale).to(p.dtype) for p in lists["params"]]
    kernel(lists["params"], grads, lists["exp_avgs"], lists["exp_avg_sqs"], lists["maxes"], lists["masters"],
           lists["steps"], 1e-2, 0.9, 0.999, 1e-8, 0.05, adam_w_mode, bias_correction, amsgrad, maximize,
           lr_tensor, grad_scale, found_inf)
    return grads


@pytest.mark.parametrize("adam_w_mode", [True, False], ids=["adamw", "adam"])
@pytest.mark.parametrize("amsgrad", [True, False], ids=["amsgrad", ""])
@pytest.mark.parametrize("maximize", [False, True], ids=["", "maximize"])
def test_adam_on_torch_follows_the_reference(adam_w_mode, amsgrad, maximize, torch_calls):
    ours, ref = adam_lists(amsgrad=amsgrad), adam_lists(amsgrad=amsgrad)
    kw = dict(adam_w_mode=adam_w_mode, amsgrad=amsgrad, maximize=maximize, scale=4.0,
              grad_scale=torch.tensor([4.0]), found_inf=torch.zeros(1), lr_tensor=torch.tensor([1e-2]))
    for seed in range(STEPS):
        g_ours = adam_step(TORCH["fused_adam_"], ours, seed, **kw)
        g_ref = adam_step(REF["fused_adam_"], ref, seed, **kw)
        assert all(torch.equal(a, b) for a, b in zip(g_ours, g_ref))  # written back unscaled (exact: 4)
    assert torch_calls == {"_fused_adamw_" if adam_w_mode else "_fused_adam_": STEPS}
    for key in ("params", "exp_avgs", "exp_avg_sqs", "maxes"):
        for a, b in zip(ours[key], ref[key]):
            ulps_close(a, b)
    assert [s.item() for s in ours["steps"]] == [float(STEPS)] * len(SIZES)


@pytest.mark.parametrize("flag", [torch.ones(1), torch.ones(1, dtype=torch.int32), torch.full((1,), 2.0)],
                         ids=["float", "int32", "two"])
def test_a_skipped_adam_step_changes_nothing(flag):
    lists = adam_lists()
    adam_step(TORCH["fused_adam_"], lists, 0)
    before = copy.deepcopy(lists)
    grads = adam_step(TORCH["fused_adam_"], lists, 1, grad_scale=torch.tensor([8.0]), found_inf=flag, scale=8.0)
    for key, ts in lists.items():
        assert all(torch.equal(a, b) for a, b in zip(ts, before[key])), key  # steps included
    g = torch.Generator().manual_seed(1)
    assert all(torch.equal(x, (torch.randn(x.shape, generator=g) * 8.0)) for x in grads)  # not unscaled
    assert flag.item() > 0  # read, not written


@pytest.mark.parametrize("case", ["masters", "no_bias_correction", "bf16"])
def test_calls_torch_cannot_take_run_on_the_reference_exactly(case, torch_calls):
    dtype = torch.bfloat16 if case in ("bf16", "masters") else torch.float32
    ours, ref = adam_lists(dtype, masters=case == "masters"), adam_lists(dtype, masters=case == "masters")
    kw = dict(bias_correction=case != "no_bias_correction")
    for seed in range(3):
        adam_step(TORCH["fused_adam_"], ours, seed, **kw)
        adam_step(REF["fused_adam_"], ref, seed, **kw)
    for key in ("params", "exp_avgs", "exp_avg_sqs", "masters"):
        assert all(torch.equal(a, b) for a, b in zip(ours[key], ref[key])), key
    assert torch_calls == {}


def compact_lists(moments, weights):
    from core_ops.reference.compact_state import dynamic_map, quantize
    g = torch.Generator().manual_seed(0)
    sizes = (1, 4096, 40000)
    dtype = torch.bfloat16 if weights == "remainder" else torch.float32
    params = [torch.randn(n, generator=g).to(dtype) for n in sizes]
    if moments == "int8":
        ms, ma = map(list, zip(*[quantize(torch.zeros(n), dynamic_map(True)) for n in sizes]))
        vs, va = map(list, zip(*[quantize(torch.zeros(n), dynamic_map(False)) for n in sizes]))
        maps = dynamic_map(True), dynamic_map(False)
    else:
        state = torch.float32 if moments == "float32" else torch.bfloat16
        ms, vs, ma, va, maps = [torch.zeros(n, dtype=state) for n in sizes], [torch.zeros(n, dtype=state) for n in sizes], \
            [], [], (None, None)
    masters = [torch.zeros(n, dtype=torch.int16) for n in sizes] if weights == "remainder" else []
    return [params, None, ms, vs, ma, va, masters, [torch.zeros(()) for _ in sizes]], maps


def compact_step(kernel, lists, maps, seed, **kw):
    g = torch.Generator().manual_seed(seed)
    lists[1] = [(torch.randn(p.shape, generator=g) * 4.0).to(p.dtype) for p in lists[0]]
    kernel(*lists, *maps, 1e-2, 0.9, 0.999, 1e-8, 0.05, True, True, False, None, kw.get("grad_scale"),
           kw.get("found_inf"))


@pytest.mark.parametrize("moments", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("weights", ["remainder", "none"])
def test_compact_adam_on_torch_follows_the_reference(moments, weights, torch_calls):
    """Tolerances: the weights as for fused_adam_ (8 ulps of the largest |param| after
    20 steps). With compact moments an ulp-level difference can round a moment the other
    way (bf16: 2**-8 of it; 8-bit: a code, within 1.5% of its block's maximum), and that
    element's later updates follow its moment: such elements are rare (<= 0.1%) and
    stay within 1% of the 20 steps' total lr (2e-3)."""
    from core_ops.reference.compact_state import BLOCK, dequantize, dynamic_map, join_master
    (ours, maps), (ref, _) = compact_lists(moments, weights), compact_lists(moments, weights)
    kw = dict(grad_scale=torch.tensor([4.0]), found_inf=torch.zeros(1))
    for seed in range(STEPS):
        compact_step(TORCH["fused_adam_compact_"], ours, maps, seed, **kw)
        compact_step(REF["fused_adam_compact_"], ref, maps, seed, **kw)
    assert torch_calls == {"_fused_adamw_": STEPS}
    for i in range(3):
        a, b = ours[0][i].float(), ref[0][i].float()
        if weights == "remainder":
            a, b = join_master(ours[0][i], ours[6][i]), join_master(ref[0][i], ref[6][i])
        if moments == "float32":
            ulps_close(a, b)
        else:
            tol = 8 * torch.finfo(torch.float32).eps * b.abs().max()
            assert int(((a - b).abs() > tol).sum()) <= max(1, a.numel() // 1000)
            assert float((a - b).abs().max()) <= 0.01 * STEPS * 1e-2
        for k, qmap in ((2, dynamic_map(True)), (3, dynamic_map(False))):
            if moments == "int8" and ours[k][i].numel() >= 4096:
                x = dequantize(ours[k][i], ours[k + 2][i], qmap)
                y = dequantize(ref[k][i], ref[k + 2][i], qmap)
                scale = ref[k + 2][i].repeat_interleave(BLOCK)[:x.numel()]
                assert bool(((x - y).abs() <= 0.015 * scale).all())
            elif moments != "int8":
                torch.testing.assert_close(ours[k][i].float(), ref[k][i].float(), rtol=1e-2 if moments == "bfloat16"
                                           else 1e-5, atol=1e-7)
    assert [s.item() for s in ours[7]] == [float(STEPS)] * 3


def test_a_skipped_compact_step_changes_nothing():
    lists, maps = compact_lists("int8", "remainder")
    compact_step(TORCH["fused_adam_compact_"], lists, maps, 0)
    before = copy.deepcopy(lists)
    compact_step(TORCH["fused_adam_compact_"], lists, maps, 1, grad_scale=torch.tensor([8.0]), found_inf=torch.ones(1))
    for key in (0, 2, 3, 4, 5, 6, 7):
        assert all(torch.equal(a, b) for a, b in zip(lists[key], before[key])), key
    g = torch.Generator().manual_seed(1)
    assert all(torch.equal(x, (torch.randn(x.shape, generator=g) * 4.0).to(x.dtype)) for x in lists[1])


def test_bad_input_gets_the_reference_s_errors():
    lists = adam_lists()
    bad = [torch.zeros(3)] + [torch.zeros(n) for n in SIZES[1:]]
    with pytest.raises(ValueError, match=r"grads\[0\] has shape \[3\]"):
        TORCH["fused_adam_"](lists["params"], bad, lists["exp_avgs"], lists["exp_avg_sqs"], [], [], lists["steps"],
                            1e-2, 0.9, 0.999, 1e-8, 0.0, True, True, False, False, None, None, None)
    assert [s.item() for s in lists["steps"]] == [0.0] * len(SIZES)  # nothing changed


@pytest.mark.parametrize("kw", [dict(momentum=0.0, weight_decay=0.0, nesterov=False, dampening=0.0),
                                dict(momentum=0.9, weight_decay=0.01, nesterov=False, dampening=0.1),
                                dict(momentum=0.9, weight_decay=0.01, nesterov=True, dampening=0.0)],
                         ids=["plain", "momentum", "nesterov"])
@pytest.mark.parametrize("maximize", [False, True], ids=["", "maximize"])
def test_sgd_on_torch_follows_the_reference(kw, maximize, torch_calls):
    g = torch.Generator().manual_seed(0)
    start = [torch.randn(n, generator=g) for n in SIZES]
    runs = []
    for kernel in (TORCH["fused_sgd_"], REF["fused_sgd_"]):
        params, bufs = [p.clone() for p in start], [torch.zeros(n) for n in SIZES]
        gen = torch.Generator().manual_seed(1)
        for step in range(STEPS):
            grads = [torch.randn(n, generator=gen) * 2.0 for n in SIZES]
            kernel(params, grads, bufs, [], 0.05, kw["momentum"], kw["dampening"], kw["weight_decay"],
                   kw["nesterov"], False, step == 0, maximize, None, torch.tensor([2.0]), torch.zeros(1))
        runs.append((params, bufs))
    assert torch_calls == {"_fused_sgd_": STEPS}
    for a, b in zip(*[p for p, _ in runs]):
        ulps_close(a, b)
    for a, b in zip(*[m for _, m in runs]):
        ulps_close(a, b)


@pytest.mark.parametrize("kw", [dict(lr_decay=0.0, weight_decay=0.0), dict(lr_decay=0.01, weight_decay=0.05)],
                         ids=["plain", "decays"])
def test_adagrad_on_torch_follows_the_reference(kw, torch_calls):
    g = torch.Generator().manual_seed(0)
    start = [torch.randn(n, generator=g) for n in SIZES]
    runs = []
    for kernel in (TORCH["fused_adagrad_"], REF["fused_adagrad_"]):
        params, sums, steps = [p.clone() for p in start], [torch.zeros(n) for n in SIZES], [torch.zeros(())
                                                                                             for _ in SIZES]
        gen = torch.Generator().manual_seed(1)
        for _ in range(STEPS):
            grads = [torch.randn(n, generator=gen) for n in SIZES]
            kernel(params, grads, sums, [], steps, 0.05, kw["lr_decay"], 1e-10, kw["weight_decay"], False, False,
                   None, None, torch.zeros(1))
        runs.append((params, sums, steps))
    assert torch_calls == {"_fused_adagrad_": STEPS}
    for key in range(2):
        for a, b in zip(runs[0][key], runs[1][key]):
            ulps_close(a, b)
    assert [s.item() for s in runs[0][2]] == [float(STEPS)] * len(SIZES)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_in_place_unscale_on_torch_equals_the_reference(dtype, torch_calls):
    g = torch.Generator().manual_seed(0)
    ts = [(torch.randn(n, generator=g) * 1000).to(dtype) for n in SIZES]
    ours, ref = [t.clone() for t in ts], [t.clone() for t in ts]
    flag_ours, flag_ref = torch.zeros(1), torch.zeros(1)
    scale = torch.tensor([1 / 3.0])
    TORCH["multi_tensor_scale_"](ours, ours, scale, flag_ours)
    REF["multi_tensor_scale_"](ref, ref, scale, flag_ref)
    assert all(torch.equal(a, b) for a, b in zip(ours, ref)) and flag_ours.item() == flag_ref.item() == 0
    assert torch_calls == {"_amp_foreach_non_finite_check_and_unscale_": 1}
    ours[2][5] = float("nan")
    TORCH["multi_tensor_scale_"](ours, ours, scale, flag_ours)
    assert flag_ours.item() == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64],
                         ids=["fp32", "fp16", "bf16", "fp64"])
def test_l2norm_on_torch_follows_the_reference(dtype, torch_calls):
    """Sums of squares in another order: the norm tolerance of the multi-tensor tests
    (Note [Test tolerances]: 1e-5 relative in float32, 1e-12 in float64)."""
    g = torch.Generator().manual_seed(0)
    ts = [torch.randn(n, generator=g).to(dtype) for n in SIZES]
    total, per = TORCH["multi_tensor_l2norm"](ts, True)
    ref_total, ref_per = REF["multi_tensor_l2norm"](ts, True)
    assert total.dtype == ref_total.dtype and per.shape == ref_per.shape
    tol = dict(rtol=1e-12, atol=0) if dtype == torch.float64 else dict(rtol=1e-5, atol=0)
    torch.testing.assert_close(total, ref_total, **tol)
    torch.testing.assert_close(per, ref_per, **tol)
    assert torch_calls == {"_foreach_norm": 1}
    assert TORCH["multi_tensor_l2norm"](ts, False)[1].numel() == 0


BACKENDS_WITHOUT_A_COMPILER = """
import torch, core_ops
from core_ops import native
from core_ops.optimizers import FusedAdam
assert not native.ensure("cpu").native
print(core_ops._info.format_report(core_ops.backend_report()))
torch.manual_seed(0)
ours = [torch.randn(n, requires_grad=True) for n in (17, 40000)]
theirs = [p.detach().clone().requires_grad_() for p in ours]
a = FusedAdam(ours, lr=1e-2, weight_decay=0.05)
b = torch.optim.AdamW(theirs, lr=1e-2, weight_decay=0.05, fused=True)
for _ in range(10):
    for p, q in zip(ours, theirs):
        p.grad = torch.randn(p.shape)
        q.grad = p.grad.clone()
    a.step(); b.step()
print("MAXDIFF", max(float((p - q).abs().max()) for p, q in zip(ours, theirs)))
"""


def test_a_process_that_cannot_compile_uses_and_reports_backends_3_and_4(tmp_path):
    # The JIT route (a wheel install's own library would serve first), with no compiler.
    env = dict(os.environ, CXX="/bin/false", CORE_OPS_CACHE_DIR=str(tmp_path), CORE_OPS_BACKEND="jit")
    proc = subprocess.run([sys.executable, "-c", "import core_ops._info\n" + BACKENDS_WITHOUT_A_COMPILER],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    cpu = proc.stdout.split("[cpu]")[1].split("[cuda]")[0]
    lines = {line.split()[0]: line for line in cpu.splitlines()[1:] if line.strip()}
    assert "3 torch (torch._fused_adam_ / _fused_adamw_) where the call fits, else 4 reference" in lines["fused_adam_"]
    assert "3 torch (torch._fused_sgd_)" in lines["fused_sgd_"]
    assert lines["fused_lamb_stage1_"].split()[-2:] == ["4", "reference"]
    passed = [line.strip().split(": ")[1] for line in cpu.splitlines() if line.strip().startswith("passed over")]
    assert passed == ["1 wheel", "2 jit"]  # each native backend, and why (no compiler for the second)
    # The same kernel as torch's own fused AdamW: equal but for the scalars' rounding.
    assert float(proc.stdout.split("MAXDIFF")[1]) <= 8 * torch.finfo(torch.float32).eps * 5
