"""The layer-norm and RMS-norm ops (Note [Norm ops] in _schemas.py): native kernels
against the reference (which test_norm_reference.py checks against torch in fp64), for
every dtype, row lengths around the vector width, empty batches and large rows; the
public functions under torch.compile, the mixed output dtype, the fused residual form
and bad input (their autograd: test_norm_autograd.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import dtype_id

from core_ops import native
from core_ops._schemas import op
from core_ops.normalization.fused import fused_add_rms_norm, layer_norm, rms_norm
from core_ops.reference import KERNELS as REF

HERE = Path(__file__).resolve().parent
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
# The CPU kernels work in steps of two vector registers, 16 floats with AVX2 and 32 with
# AVX-512: rows straddle one and two steps of either. CUDA threads read 16-byte packs
# (4 fp32, 8 half values) or, for rows of another length, one value at a time (15, 17,
# 511, 513, ...); rows of up to 16384 values are held in registers, 16 a thread in up
# to 1024 threads, longer ones read again for each pass (Note [CUDA norm kernels]):
# 16384 and 16385 straddle that, 65536 is a long row.
HIDDEN = [1, 15, 16, 17, 31, 33, 63, 65, 511, 513, 2047, 2049, 16384, 16385, 65536]
# Native and reference differ in the order of their float32 sums and in FMA; an output
# is then within one rounding of its dtype of the other's. Relative to the largest
# element (a backward's dx cancels terms of that size).
TOL = {torch.float64: 1e-12, torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}


@pytest.fixture(autouse=True)
def _native_loaded(device):
    backend = native.ensure(device)
    if not backend.native:
        pytest.fail(f"native {device} kernels did not load: {backend.reason}")


def assert_near(got, want, dtype):
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.numel() == 0:
        return
    scale = want.double().abs().max().clamp(min=1e-30)
    err = (got.double() - want.double()).abs().max() / scale
    assert err <= TOL[dtype], f"relative error {err.item():.3g} > {TOL[dtype]}"


def case(device, dtype, rows, hidden, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, hidden, generator=g) * 3 + 0.5).to(device, dtype)
    w = (torch.rand(hidden, generator=g) + 0.5).to(device, dtype)
    b = torch.randn(hidden, generator=g).to(device, dtype)
    dy = torch.randn(rows, hidden, generator=g).to(device, dtype)
    return x, w, b, dy


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("memory_efficient", [False, True], ids=["saves_x", "saves_y"])
def test_layer_norm_native_equals_reference(device, dtype, hidden, affine, memory_efficient):
    rows = 3 if hidden == 65536 else 7
    x, w, b, dy = case(device, dtype, rows, hidden)
    w, b = (w, b) if affine else (None, None)
    got = op("layer_norm_fwd")(x, w, b, hidden, 1e-5, None, memory_efficient)
    want = REF["layer_norm_fwd"](x, w, b, hidden, 1e-5, None)
    for g_, w_ in zip(got, want):
        assert_near(g_, w_, dtype)
    saved = got[0] if memory_efficient else x
    grads = op("layer_norm_bwd")(dy, saved, got[1], got[2], w, b, hidden, memory_efficient, dtype)
    ref = REF["layer_norm_bwd"](dy, saved, got[1], got[2], w, b, hidden, memory_efficient, dtype)
    for g_, r_ in zip(grads, ref):
        assert_near(g_, r_, dtype)


# A bias without a weight (or a weight without a bias): from the output, xhat undoes
# the one there is. The kernels once took a bias alone for no affine map at all, and
# dx was off by up to 1.7 of 2.9 (issue 51).
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("hidden", [1, 17, 65, 2049, 16385])
@pytest.mark.parametrize("which", ["weight", "bias"])
@pytest.mark.parametrize("memory_efficient", [False, True], ids=["saves_x", "saves_y"])
def test_layer_norm_with_weight_or_bias_alone_native_equals_reference(device, dtype, hidden, which,
                                                                      memory_efficient):
    x, w, b, dy = case(device, dtype, 7, hidden)
    w, b = (w, None) if which == "weight" else (None, b)
    out, mean, rstd = op("layer_norm_fwd")(x, w, b, hidden, 1e-5, None, memory_efficient)
    saved = out if memory_efficient else x
    grads = op("layer_norm_bwd")(dy, saved, mean, rstd, w, b, hidden, memory_efficient, dtype)
    ref = REF["layer_norm_bwd"](dy, saved, mean, rstd, w, b, hidden, memory_efficient, dtype)
    for g_, r_ in zip(grads, ref):
        assert_near(g_, r_, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("memory_efficient", [False, True], ids=["saves_x", "saves_y"])
def test_rms_norm_native_equals_reference(device, dtype, hidden, affine, memory_efficient):
    rows = 3 if hidden == 65536 else 7
    x, w, _, dy = case(device, dtype, rows, hidden)
    w = w if affine else None
    got = op("rms_norm_fwd")(x, w, hidden, 1e-5, None, memory_efficient)
    want = REF["rms_norm_fwd"](x, w, hidden, 1e-5, None)
    for g_, w_ in zip(got, want):
        assert_near(g_, w_, dtype)
    saved = got[0] if memory_efficient else x
    grads = op("rms_norm_bwd")(dy, saved, got[1], w, hidden, memory_efficient, dtype)
    ref = REF["rms_norm_bwd"](dy, saved, got[1], w, hidden, memory_efficient, dtype)
    for g_, r_ in zip(grads, ref):
        assert_near(g_, r_, dtype)


# The CPU forward takes a row's variance as mean(x^2) - mean^2 from one pass while
# mean^2 <= mean(x^2) / 2, and sums the squares around the mean in a second pass when
# not (row_stats in csrc/cpu/norms.cpp). Rows of mean 100 * their spread take the
# second pass; one pass would lose about 13 of float32's 24 bits of their variance.
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("hidden", [33, 4096])
def test_layer_norm_rows_with_a_large_mean(device, dtype, hidden):
    x, w, b, dy = case(device, dtype, 6, hidden)
    offset = torch.tensor([100.0, -100.0, 1.0, 1.5, 0.0, 300.0], device=device)[:, None]
    x = (x.double() / 3 + offset * x.double().std()).to(dtype)  # rows 3-4: one pass
    got = op("layer_norm_fwd")(x, w, b, hidden, 1e-5, None, False)
    ref = REF["layer_norm_fwd"](x, w, b, hidden, 1e-5, None)
    exact = REF["layer_norm_fwd"](x.double(), w.double(), b.double(), hidden, 1e-5, None)
    # Subtracting a large mean cancels digits in any float32 method (the reference's
    # error here reaches 1e-5 of y): the kernel's error is held to the reference's.
    for g_, r_, e_ in zip(got, ref, exact):
        err = lambda t: ((t.double() - e_).abs().max() / e_.abs().max()).item()
        assert err(g_) <= 2 * err(r_) + TOL[dtype], f"{err(g_):.3g} against the reference's {err(r_):.3g}"
    torch.testing.assert_close(got[2].double(), exact[2], rtol=10 * TOL[dtype], atol=0)


# Many more rows than a CUDA backward runs blocks at once: each block walks several rows
# and leaves partial dw / db sums, added in a second kernel. dw and db sum 3000 terms, in
# another order than the reference's: each is held to the error of the reference's own
# float32 sums against fp64 (the large-mean test's rule), plus one rounding.
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("hidden", [64, 1000])
def test_weight_grads_of_many_rows(device, dtype, hidden):
    x, w, b, dy = case(device, dtype, 3000, hidden, seed=3)
    y, mean, rstd = op("layer_norm_fwd")(x, w, b, hidden, 1e-5, None, False)
    got = op("layer_norm_bwd")(dy, x, mean, rstd, w, b, hidden, False, dtype)
    ref = REF["layer_norm_bwd"](dy, x, mean, rstd, w, b, hidden, False, dtype)
    d64 = lambda t: t.double()  # noqa: E731
    exact = REF["layer_norm_bwd"](d64(dy), d64(x), d64(mean), d64(rstd), d64(w), d64(b), hidden, False, torch.float64)
    assert_near(got[0], ref[0], dtype)
    for g_, r_, e_ in zip(got[1:], ref[1:], exact[1:]):
        err = lambda t: ((t.double() - e_).abs().max() / e_.abs().max()).item()  # noqa: E731
        assert err(g_) <= 2 * err(r_) + TOL[dtype], f"{err(g_):.3g} against the reference's {err(r_):.3g}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_mixed_output_dtype(device, dtype):
    x, w, b, dy = case(device, dtype, 5, 40)
    w32, b32 = w.float(), b.float()
    y, mean, rstd = op("layer_norm_fwd")(x, w32, b32, 40, 1e-5, torch.float32, False)
    assert y.dtype == torch.float32 and mean.dtype == torch.float32
    assert_near(y, F.layer_norm(x.float(), (40,), w32, b32, 1e-5), torch.float32)
    dx, dw, db = op("layer_norm_bwd")(dy.float(), x, mean, rstd, w32, b32, 40, False, dtype)
    assert dx.dtype == dtype and dw.dtype == torch.float32
    y, rstd = op("rms_norm_fwd")(x, w32, 40, 1e-5, torch.float32, True)
    dx, dw = op("rms_norm_bwd")(dy.float(), y, rstd, w32, 40, True, dtype)
    ref = REF["rms_norm_bwd"](dy.float(), y, rstd, w32, 40, True, dtype)
    assert_near(dx, ref[0], dtype)
    assert_near(dw, ref[1], torch.float32)


def test_empty_batches_shapes_and_nan_rows(device):
    x = torch.randn(0, 4, 8, device=device)
    w = torch.ones(8, device=device, requires_grad=True)
    y = layer_norm(x.requires_grad_(), (8,), w, torch.zeros(8, device=device, requires_grad=True))
    assert y.shape == (0, 4, 8)
    y.sum().backward()
    assert torch.equal(w.grad, torch.zeros(8, device=device))
    x = torch.randn(4, 3, 16, device=device).transpose(0, 1)  # not contiguous: read through a copy
    torch.testing.assert_close(rms_norm(x, (16,)), F.rms_norm(x, (16,), eps=1e-5), rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(layer_norm(x, (16,)), F.layer_norm(x, (16,)), rtol=2e-6, atol=2e-6)
    x = torch.randn(3, 20, device=device)
    x[1, 5] = float("nan")
    for y in (layer_norm(x, (20,)), rms_norm(x, (20,))):
        assert torch.isnan(y[1]).all() and torch.isfinite(y[[0, 2]]).all()
    x = torch.randn(2, 3, 4, 5, device=device)  # several trailing dims normalized
    torch.testing.assert_close(layer_norm(x, (4, 5)), F.layer_norm(x, (4, 5)), rtol=2e-6, atol=2e-6)


@pytest.mark.inductor_cpu
def test_torch_compile_equals_eager(device):
    def step(x, w, b):
        y = layer_norm(x, (32,), w, b) + rms_norm(x, (32,), w)
        return y.square().sum()

    x = torch.randn(6, 32, device=device, requires_grad=True)
    w = torch.rand(32, device=device, requires_grad=True)
    b = torch.randn(32, device=device, requires_grad=True)
    eager = torch.autograd.grad(step(x, w, b), (x, w, b))
    compiled = torch.autograd.grad(torch.compile(step, fullgraph=True)(x, w, b), (x, w, b))
    for a, c in zip(eager, compiled):
        torch.testing.assert_close(a, c, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("hidden", [1, 17, 513, 2048, 16385, 65536])
def test_fused_add_rms_norm_native_equals_reference(device, dtype, hidden):
    x, w, _, dy = case(device, dtype, 3, hidden)
    res = torch.randn_like(x)
    got = op("fused_add_rms_norm_fwd")(x, res, w, hidden, 1e-6, False)
    want = REF["fused_add_rms_norm_fwd"](x, res, w, hidden, 1e-6)
    assert torch.equal(got[1], x + res)  # h: the sum rounded once to the dtype, as torch's add
    for g_, w_ in zip(got, want):
        assert_near(g_, w_, dtype)


# Outputs of 32 MiB or more in memory already in use are written with streaming stores
# on CPU (stream_rows in csrc/cpu/stream_store.h); smaller ones, and memory fresh from
# the OS, with normal stores. Rows are computed alike either way, so the first and last
# rows of a large call equal, bit for bit, the same rows normalized in a small call;
# all rows are checked against the reference. Every call runs twice: the second finds
# its outputs in memory the first freed.
def check_large_outputs(device, dtype):
    hidden = 4096
    rows = (32 << 20) // (hidden * dtype.itemsize)
    x, w, b, dy = case(device, dtype, rows, hidden)
    ends = (slice(0, 8), slice(rows - 8, rows))
    runs = {
        "layer_norm": lambda x, dy: (
            (y := op("layer_norm_fwd")(x, w, b, hidden, 1e-5, None, False))[0],
            op("layer_norm_bwd")(dy, x, y[1], y[2], w, b, hidden, False, dtype)[0]),
        "rms_norm": lambda x, dy: (
            (y := op("rms_norm_fwd")(x, w, hidden, 1e-5, None, False))[0],
            op("rms_norm_bwd")(dy, x, y[1], w, hidden, False, dtype)[0]),
        "fused_add_rms_norm": lambda x, dy: op("fused_add_rms_norm_fwd")(x, dy, w, hidden, 1e-5, False)[:2],
    }
    for name, run in runs.items():
        for _ in range(2):
            large = run(x, dy)
            for rows_ in ends:
                for got, want in zip(large, run(x[rows_], dy[rows_])):
                    assert torch.equal(got[rows_], want), f"{name}: rows {rows_} differ from a small call"
            del large
    for _ in range(2):
        y, mean, rstd = op("layer_norm_fwd")(x, w, b, hidden, 1e-5, None, False)
        assert_near(y, REF["layer_norm_fwd"](x, w, b, hidden, 1e-5, None)[0], dtype)
        dx = op("layer_norm_bwd")(dy, x, mean, rstd, w, b, hidden, False, dtype)[0]
        assert_near(dx, REF["layer_norm_bwd"](dy, x, mean, rstd, w, b, hidden, False, dtype)[0], dtype)
        y, h, _ = op("fused_add_rms_norm_fwd")(x, dy, w, hidden, 1e-5, False)
        assert torch.equal(h, x + dy)
        assert_near(y, REF["fused_add_rms_norm_fwd"](x, dy, w, hidden, 1e-5)[0], dtype)
        del y, h, dx


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_large_outputs_in_fresh_memory(device, dtype):
    check_large_outputs(device, dtype)  # glibc maps blocks this large anew: normal stores


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_large_outputs_in_reused_memory_streamed(device, dtype):
    if device != "cpu":
        pytest.skip("streaming stores are the CPU kernels'")
    # glibc told to keep freed memory (as a caching allocator does), and 1 GiB of it
    # touched and freed first, so the outputs land in memory in use: streaming stores.
    env = dict(os.environ, MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_=str(1 << 40),
               PYTHONPATH=os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    code = ("import torch, test_norm_ops as t; assert t.native.ensure('cpu').native; "
            "pool = torch.ones(1 << 30, dtype=torch.uint8); del pool; "
            f"t.check_large_outputs('cpu', torch.{dtype}); print('OK')")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


def test_fused_add_rms_norm_grads_equal_the_unfused_form(device):
    x, w, _, dy = case(device, torch.float32, 4, 48)
    res = torch.randn_like(x)
    leaves = [t.clone().requires_grad_() for t in (x, res, w)]
    twins = [t.clone().requires_grad_() for t in (x, res, w)]
    y, h = fused_add_rms_norm(*leaves, eps=1e-6)
    (y * dy).sum().add(h.square().sum()).backward()  # both outputs carry grads
    h2 = twins[0] + twins[1]
    (F.rms_norm(h2, (48,), twins[2], 1e-6) * dy).sum().add(h2.square().sum()).backward()
    torch.testing.assert_close(y, F.rms_norm(x + res, (48,), w, 1e-6), rtol=2e-6, atol=2e-6)
    for a, b in zip(leaves, twins):
        torch.testing.assert_close(a.grad, b.grad, rtol=2e-5, atol=2e-5)


def test_bad_input_is_named(device):
    x = torch.randn(4, 8, device=device)
    with pytest.raises(ValueError, match=r"normalized_shape \[7\] must be the trailing dims"):
        layer_norm(x, (7,))
    with pytest.raises(ValueError, match="weight has 6 elements; expected hidden=8"):
        layer_norm(x, (8,), torch.ones(6, device=device))
    with pytest.raises(TypeError, match="out_dtype must be input's dtype"):
        rms_norm(x, (8,), out_dtype=torch.float16)
    with pytest.raises(TypeError, match="input must be a floating-point tensor"):
        rms_norm(torch.ones(2, 8, dtype=torch.int64, device=device), (8,))
    with pytest.raises(ValueError, match="residual must match input"):
        fused_add_rms_norm(x, torch.randn(4, 9, device=device), torch.ones(8, device=device))
    with pytest.raises(ValueError, match="residual must match input"):
        fused_add_rms_norm(x, x.double(), torch.ones(8, device=device))


def _no_kernel(name):
    raise AssertionError(f"{name} reached the dispatcher with bad input")


@pytest.mark.parametrize("case", ["weight", "bias", "shape", "dtype", "out_dtype", "residual"])
def test_bad_input_raises_before_any_op_runs(device, case, monkeypatch):
    """Note [Norm checks before dispatch]: the public functions check in Python before
    calling an op, so a bad input never reaches device code or the autograd (on the
    H200, layer_norm with a short weight took the CUDA process down)."""
    import core_ops.normalization.fused as fused
    monkeypatch.setattr(fused, "op", _no_kernel)
    x = torch.randn(4, 8, device=device, requires_grad=True)
    ones = lambda n, **kw: torch.ones(n, device=device, **kw)  # noqa: E731
    call, error = {
        "weight": (lambda: layer_norm(x, (8,), ones(6)), "weight has 6 elements; expected hidden=8"),
        "bias": (lambda: layer_norm(x, (8,), ones(8), ones(9)), "bias has 9 elements; expected hidden=8"),
        "shape": (lambda: rms_norm(x, (4, 8, 1)), r"normalized_shape \[4, 8, 1\] must be the trailing dims"),
        "dtype": (lambda: rms_norm(x, (8,), ones(8, dtype=torch.int32)), "weight must be floating-point"),
        "out_dtype": (lambda: layer_norm(x, (8,), out_dtype=torch.float16), "out_dtype must be input's dtype"),
        "residual": (lambda: fused_add_rms_norm(x, x[:, :4], ones(8)), "residual must match input"),
    }[case]
    with pytest.raises((ValueError, TypeError), match=error):
        call()


def test_ops_called_directly_check_before_their_autograd_and_kernels(device):
    """The ops themselves, with grad (the kernel's checks raise inside the autograd's
    forward, before a node is built) and without; and the backwards' statistics, which
    the kernels index by row: a short rstd was read past its end."""
    x = torch.randn(4, 8, device=device)
    for grad in (True, False):
        xi = x.clone().requires_grad_(grad)
        with pytest.raises(ValueError, match="weight has 6 elements; expected hidden=8"):
            op("layer_norm_fwd")(xi, torch.ones(6, device=device), None, 8, 1e-5, None, False)
        with pytest.raises(ValueError, match="weight has 6 elements; expected hidden=8"):
            op("rms_norm_fwd")(xi, torch.ones(6, device=device), 8, 1e-5, None, False)
        with pytest.raises(ValueError, match="residual must match input"):
            op("fused_add_rms_norm_fwd")(xi, x.double(), None, 8, 1e-5, False)
    stats = torch.ones(4, device=device)
    with pytest.raises(ValueError, match=r"rstd must hold 4 torch.float32 values \(one per row\)"):
        op("rms_norm_bwd")(x, x, stats[:3], None, 8, False, torch.float32)
    with pytest.raises(ValueError, match=r"mean must hold 4 torch.float32 values"):
        op("layer_norm_bwd")(x, x, stats.double(), stats, None, None, 8, False, torch.float32)
    with pytest.raises(ValueError, match="grad_out has 16 elements"):
        op("layer_norm_bwd")(x[:2], x, stats, stats, None, None, 8, False, torch.float32)
    for name, kernel in (("reference", REF["rms_norm_bwd"]),):
        with pytest.raises(ValueError, match="rstd must hold 4"):
            kernel(x, x, stats[:3], None, 8, False, torch.float32)


# nn.RMSNorm's eps=None is the machine epsilon of the input's dtype; a model converted
# to the fused modules keeps it (a bench swapping the norms of a stack hit a TypeError).
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_rms_norm_eps_none_is_the_dtypes_epsilon(device, dtype):
    from core_ops.normalization import FusedRMSNorm
    x = case(device, dtype, 4, 24)[0] * 1e-2  # eps matters against mean(x^2) ~ 1e-3
    eps = torch.finfo(dtype).eps  # torch's None; computed in float32 here for the reference
    assert_near(FusedRMSNorm(24, eps=None).to(device)(x), F.rms_norm(x.float(), (24,), eps=eps).to(dtype), dtype)
    y, h = fused_add_rms_norm(x, x, None, eps=None)
    assert_near(y, F.rms_norm(h.float(), (24,), eps=eps).to(dtype), dtype)
