"""Native kernels against the reference kernels, for every dtype and edge case.

The reference (core_ops/reference) is itself checked against torch in fp64 in
test_multi_tensor_reference.py. Tolerances: Note [Test tolerances] in conftest.py.
"""

import itertools

import pytest
import torch
from cases import EDGE_SIZES, make_list, noncontiguous, poison
from conftest import ELEMENTWISE_TOL, FLOATS, NORM_TOL, assert_axpby_close, dtype_id

import core_ops
from core_ops import native as backends
from core_ops.reference import KERNELS as REF


def native(name):
    return getattr(torch.ops.core_ops, name)


@pytest.fixture(autouse=True)
def _native_loaded(device):
    backend = backends.ensure(device)
    if not backend.native:
        pytest.fail(f"native {device} kernels did not load: {backend.reason}")


def test_native_kernels_are_registered(device):
    from core_ops._info import op_backend
    from core_ops._schemas import OP_NAMES
    assert {op_backend(n, device) for n in OP_NAMES} == {"native"}


def flag(device, dtype=torch.float32):
    return torch.zeros(1, dtype=dtype, device=device)


@pytest.mark.parametrize("src_dtype,dst_dtype", list(itertools.product(FLOATS, FLOATS)) +
                         [(torch.float64, torch.float64)],
                         ids=lambda d: dtype_id(d))
def test_scale_matches_reference(device, src_dtype, dst_dtype):
    src = make_list(EDGE_SIZES, src_dtype, device)
    scale = torch.tensor([0.37], device=device)
    out_n = [torch.empty_like(t, dtype=dst_dtype) for t in src]
    out_r = [torch.empty_like(t, dtype=dst_dtype) for t in src]
    fn, fr = flag(device), flag(device)
    native("multi_tensor_scale_")(src, out_n, scale, fn)
    REF["multi_tensor_scale_"](src, out_r, scale, fr)
    for a, b in zip(out_n, out_r):
        torch.testing.assert_close(a, b, **ELEMENTWISE_TOL[dst_dtype])
    assert fn.item() == fr.item() == 0


@pytest.mark.parametrize("dtype", FLOATS + [torch.float64], ids=dtype_id)
def test_check_finite_matches_reference(device, dtype):
    ts = make_list(EDGE_SIZES, dtype, device, seed=12)
    fn, fr = flag(device), flag(device)
    native("multi_tensor_check_finite_")(ts, fn)
    REF["multi_tensor_check_finite_"](ts, fr)
    assert fn.item() == fr.item() == 0
    # The largest finite value of the dtype: no flag, though the norm overflows where
    # its square does (float32 accumulation of float32 / bfloat16 / float64 squares).
    big = [t.clone() for t in ts]
    big[-1].view(-1)[-1] = torch.finfo(dtype).max
    fn = core_ops.multi_tensor_check_finite(big, found_inf=flag(device))
    assert fn.item() == 0
    if dtype != torch.float16:
        assert not torch.isfinite(core_ops.multi_tensor_l2norm(big)[0])


@pytest.mark.parametrize("dtypes", [(torch.float32,) * 3, (torch.float16, torch.float32, torch.bfloat16),
                                    (torch.bfloat16, torch.float16, torch.float32),
                                    (torch.float64,) * 3], ids=lambda ds: "-".join(map(dtype_id, ds)))
def test_axpby_matches_reference(device, dtypes):
    xd, yd, od = dtypes
    x = make_list(EDGE_SIZES, xd, device, seed=1)
    y = make_list(EDGE_SIZES, yd, device, seed=2)
    out_n = [torch.empty_like(t, dtype=od) for t in x]
    out_r = [torch.empty_like(t, dtype=od) for t in x]
    fn, fr = flag(device), flag(device)
    native("multi_tensor_axpby_")(x, y, out_n, 1.5, -0.25, fn, -1)
    REF["multi_tensor_axpby_"](x, y, out_r, 1.5, -0.25, fr, -1)
    for xi, yi, a, b in zip(x, y, out_n, out_r):
        assert_axpby_close(a, xi, yi, 1.5, -0.25)
        assert_axpby_close(b, xi, yi, 1.5, -0.25)


@pytest.mark.parametrize("dtype", FLOATS + [torch.float64], ids=dtype_id)
@pytest.mark.parametrize("per_tensor", [False, True])
def test_l2norm_matches_reference(device, dtype, per_tensor):
    ts = make_list(EDGE_SIZES, dtype, device, seed=3)
    total_n, per_n = native("multi_tensor_l2norm")(ts, per_tensor)
    total_r, per_r = REF["multi_tensor_l2norm"](ts, per_tensor)
    tol = NORM_TOL[torch.float64 if dtype == torch.float64 else torch.float32]
    assert total_n.dtype == total_r.dtype and total_n.shape == total_r.shape == ()
    torch.testing.assert_close(total_n, total_r, **tol)
    assert per_n.shape == (len(ts) if per_tensor else 0,)
    torch.testing.assert_close(per_n, per_r, **tol)


@pytest.mark.parametrize("dtype", FLOATS + [torch.float64], ids=dtype_id)
def test_unscale_l2norm_matches_reference(device, dtype):
    ts_n = make_list(EDGE_SIZES, dtype, device, seed=4, scale=1024.0)
    ts_r = [t.clone() for t in ts_n]
    inv = torch.tensor([1 / 1024], device=device)
    fn, fr = flag(device), flag(device)
    total_n, per_n = native("multi_tensor_unscale_l2norm_")(ts_n, inv, fn, True)
    total_r, per_r = REF["multi_tensor_unscale_l2norm_"](ts_r, inv, fr, True)
    tol = NORM_TOL[torch.float64 if dtype == torch.float64 else torch.float32]
    torch.testing.assert_close(total_n, total_r, **tol)
    torch.testing.assert_close(per_n, per_r, **tol)
    for a, b in zip(ts_n, ts_r):
        torch.testing.assert_close(a, b, **ELEMENTWISE_TOL[dtype])
    assert fn.item() == fr.item() == 0


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
@pytest.mark.parametrize("flag_dtype", [torch.float32, torch.int32], ids=dtype_id)
def test_nonfinite_sets_flag(device, value, where, dtype, flag_dtype):
    sizes = [16384 + 1, 100, 3]
    for poisoned in range(len(sizes)):
        src = make_list(sizes, dtype, device, seed=5)
        poison(src[poisoned], where, value)
        f = core_ops.multi_tensor_scale(src, [torch.empty_like(t) for t in src], 2.0,
                                        found_inf=flag(device, flag_dtype))
        assert f.item() == 1, (poisoned, where)
        assert core_ops.multi_tensor_check_finite(src, found_inf=flag(device, flag_dtype)).item() == 1
        _, _, f2 = core_ops.multi_tensor_unscale_l2norm([t.clone() for t in src], 0.5,
                                                        found_inf=flag(device, flag_dtype))
        assert f2.item() == 1
        other = make_list(sizes, dtype, device, seed=6)
        for check, expect in [(-1, 1), (0, 1), (1, 0)]:
            f3 = core_ops.multi_tensor_axpby(src, other, [torch.empty_like(t) for t in src],
                                             1.0, 1.0, found_inf=flag(device, flag_dtype),
                                             arg_to_check=check)
            assert f3.item() == expect, check


def test_flag_is_never_cleared(device):
    f = torch.ones(1, device=device)
    core_ops.multi_tensor_scale([torch.ones(5, device=device)], [torch.empty(5, device=device)], 1.0, f)
    assert f.item() == 1


def test_many_tensors_and_single_tensor(device):
    for sizes in ([1000] * 500, [3 * 65536 + 17]):
        ts = make_list(sizes, torch.float32, device, seed=7)
        total, per = core_ops.multi_tensor_l2norm(ts, per_tensor=True)
        expect = torch.stack([t.double().norm() for t in ts])
        torch.testing.assert_close(per.double(), expect, **NORM_TOL[torch.float32])
        torch.testing.assert_close(total.double(), expect.norm(), **NORM_TOL[torch.float32])
        out = [torch.empty_like(t) for t in ts]
        core_ops.multi_tensor_scale(ts, out, 3.0)
        assert all(torch.equal(o, t * 3.0) for o, t in zip(out, ts))


def test_empty_lists(device):
    total, per = core_ops.multi_tensor_l2norm([])
    assert total.item() == 0 and per.numel() == 0
    assert core_ops.multi_tensor_scale([], [], 2.0).item() == 0
    assert core_ops.multi_tensor_check_finite([]).item() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_noncontiguous_inputs_and_outputs(device, dtype):
    src = [noncontiguous(n, dtype, device, seed=i) for i, n in enumerate([5, 16385])]
    dst = [noncontiguous(n, torch.float32, device, seed=9) for n in [5, 16385]]
    assert not any(t.is_contiguous() for t in src + dst)
    core_ops.multi_tensor_scale(src, dst, 0.5)
    for s, d in zip(src, dst):
        assert torch.equal(d, s.float() * 0.5)
    inplace = [t.clone().t().t() for t in dst]  # same non-contiguous layout
    expect = [t * 4.0 for t in inplace]
    total, _, _ = core_ops.multi_tensor_unscale_l2norm(inplace, 4.0)
    for t, e in zip(inplace, expect):
        assert not t.is_contiguous() and torch.equal(t, e)
    torch.testing.assert_close(total.double(), torch.cat([e.flatten() for e in expect]).double().norm(),
                               **NORM_TOL[torch.float32])
    x, y = src, [noncontiguous(n, dtype, device, seed=3) for n in [5, 16385]]
    out = [torch.empty_like(t) for t in x]
    core_ops.multi_tensor_axpby(x, y, out, 2.0, 3.0)
    for xi, yi, oi in zip(x, y, out):
        assert_axpby_close(oi, xi, yi, 2.0, 3.0)


def test_scale_in_place_with_device_scale_tensor(device):
    ts = make_list([10, 20000], torch.float16, device, seed=10)
    expect = [(t.float() * 0.125).half() for t in ts]
    core_ops.multi_tensor_scale(ts, ts, torch.tensor([0.125], device=device))
    assert all(torch.equal(t, e) for t, e in zip(ts, expect))


def test_python_float_scales_of_float64_lists_are_not_rounded_to_float32(device):
    # 0.1 as float32 is 0.10000000149...: float64 lists must see the float64 value.
    ts = [torch.ones(5, dtype=torch.float64, device=device)]
    out = [torch.empty_like(ts[0])]
    core_ops.multi_tensor_scale(ts, out, 0.1)
    assert torch.equal(out[0], torch.full_like(out[0], 0.1))
    total, _, _ = core_ops.multi_tensor_unscale_l2norm([torch.ones(4, dtype=torch.float64, device=device)], 0.1)
    assert float(total) == pytest.approx(0.2, rel=1e-15)
