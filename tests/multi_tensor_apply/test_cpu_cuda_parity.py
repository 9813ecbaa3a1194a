"""The third rung: native CPU and native CUDA kernels agree (GPU machines only)."""

import pytest
import torch
from cases import EDGE_SIZES, make_list
from conftest import ELEMENTWISE_TOL, FLOATS, NORM_TOL, dtype_id

import core_ops

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("both_native")]


@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
def test_scale_and_norms_agree(dtype):
    cpu = make_list(EDGE_SIZES + [5 * 65536 + 3] * 3, dtype, "cpu", seed=11)
    gpu = [t.cuda() for t in cpu]
    for src in (cpu, gpu):
        found = core_ops.multi_tensor_scale(src, src, 0.75)
        assert found.item() == 0
    for a, b in zip(cpu, gpu):
        torch.testing.assert_close(b.cpu(), a, **ELEMENTWISE_TOL[dtype])
    (tc, pc), (tg, pg) = core_ops.multi_tensor_l2norm(cpu, True), core_ops.multi_tensor_l2norm(gpu, True)
    torch.testing.assert_close(tg.cpu(), tc, **NORM_TOL[torch.float32])
    torch.testing.assert_close(pg.cpu(), pc, **NORM_TOL[torch.float32])
    tc, _, fc = core_ops.multi_tensor_unscale_l2norm(cpu, 0.5)
    tg, _, fg = core_ops.multi_tensor_unscale_l2norm(gpu, 0.5)
    torch.testing.assert_close(tg.cpu(), tc, **NORM_TOL[torch.float32])
    assert fc.item() == fg.item() == 0
    gpu[-1][7] = float("nan")
    assert core_ops.multi_tensor_check_finite(gpu[:-1]).item() == 0
    assert core_ops.multi_tensor_check_finite(gpu).item() == 1


def test_more_tensors_than_one_launch_holds():
    ts = [torch.full((1 + i % 7,), float(i % 5), device="cuda") for i in range(3000)]
    total, per = core_ops.multi_tensor_l2norm(ts, per_tensor=True)
    expect = torch.stack([t.double().norm() for t in ts])
    torch.testing.assert_close(per.double().cpu(), expect.cpu(), **NORM_TOL[torch.float32])
    ts[2999][0] = float("nan")
    assert core_ops.multi_tensor_scale(ts, ts, 2.0).item() == 1


def test_large_tensor_64bit_indexing():
    if torch.cuda.get_device_properties(0).total_memory < 24 * 2 ** 30:
        pytest.skip("needs 24 GiB of GPU memory")
    n = 2 ** 31 + 1025  # past int32 indexing
    t = torch.ones(n, dtype=torch.float16, device="cuda")
    t[-1] = float("inf")
    found = core_ops.multi_tensor_scale([t], [t], 0.5)
    assert found.item() == 1 and t[-2].item() == 0.5 and t[0].item() == 0.5
    total, _ = core_ops.multi_tensor_l2norm([t[:-1]])
    torch.testing.assert_close(total.double().cpu(), torch.tensor(0.5 * (n - 1) ** 0.5, dtype=torch.float64), rtol=1e-5, atol=0)
