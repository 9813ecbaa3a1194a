"""The reference kernels against torch, in float64: the top rung of the test ladder.

Each expected value is written with a different torch formulation than the reference
uses (one flat concatenation instead of per-tensor loops), so the two cannot share a bug.
"""

import torch
from cases import EDGE_SIZES, make_list

from core_ops.reference import KERNELS as REF

F64 = dict(rtol=1e-13, atol=1e-13)


def flat(ts):
    return torch.cat([t.reshape(-1) for t in ts])


def test_reference_scale_fp64():
    src = make_list(EDGE_SIZES, torch.float64, "cpu")
    dst = [torch.empty_like(t) for t in src]
    found = torch.zeros(1)
    REF["multi_tensor_scale_"](src, dst, torch.tensor([0.3], dtype=torch.float64), found)
    torch.testing.assert_close(flat(dst), flat(src) * 0.3, **F64)
    assert found.item() == 0


def test_reference_axpby_fp64():
    x = make_list(EDGE_SIZES, torch.float64, "cpu", seed=1)
    y = make_list(EDGE_SIZES, torch.float64, "cpu", seed=2)
    out = [torch.empty_like(t) for t in x]
    REF["multi_tensor_axpby_"](x, y, out, 2.5, -1.5, torch.zeros(1), -1)
    torch.testing.assert_close(flat(out), torch.add(flat(x) * 2.5, flat(y), alpha=-1.5), **F64)


def test_reference_l2norm_fp64():
    ts = make_list(EDGE_SIZES, torch.float64, "cpu", seed=3)
    total, per = REF["multi_tensor_l2norm"](ts, True)
    torch.testing.assert_close(total, flat(ts).pow(2).sum().sqrt(), **F64)
    torch.testing.assert_close(per, torch.stack([t.pow(2).sum().sqrt() for t in ts]), **F64)
    assert total.dtype == torch.float64


def test_reference_unscale_l2norm_fp64():
    ts = make_list(EDGE_SIZES, torch.float64, "cpu", seed=4)
    before = flat(ts)
    found = torch.zeros(1)
    total, _ = REF["multi_tensor_unscale_l2norm_"](ts, torch.tensor([0.25], dtype=torch.float64), found, False)
    torch.testing.assert_close(flat(ts), before * 0.25, **F64)
    torch.testing.assert_close(total, (before * 0.25).pow(2).sum().sqrt(), **F64)
    ts[1][0] = float("nan")
    REF["multi_tensor_unscale_l2norm_"](ts, torch.tensor([0.25], dtype=torch.float64), found, False)
    assert found.item() == 1


def test_reference_flags_nonfinite_without_host_sync_semantics():
    # Setting the flag is a tensor op; a clean call never lowers an already-set flag.
    found = torch.ones(1, dtype=torch.int32)
    REF["multi_tensor_scale_"]([torch.ones(3)], [torch.empty(3)], torch.ones(1), found)
    assert found.item() == 1
