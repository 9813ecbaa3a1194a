"""The sync batch-norm ops (Note [Sync batch norm ops] in core_ops/_schemas.py): schema
and fake kernels pass opcheck, the reference is checked against torch in float64, and
the native kernels against the reference in every layout and dtype."""

import pytest
import torch

from conftest import DEVICES, dtype_id
from core_ops import native
from core_ops._schemas import op
from core_ops.reference import sync_batch_norm as ref


class _Ops:
    """The ops as the package calls them: op(name), which raises a native kernel's
    refusals as ValueError / TypeError (Note [Typed errors])."""

    def __getattr__(self, name):
        return op(name)


OPS = _Ops()


def _layouts(shape, dtype, device, seed=0):
    """The same values as contiguous, channels-last (in place: a movedim view of
    (N, *, C) memory) and non-dense (a strided slice) tensors."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 1).to(dtype).to(device)
    last = x.movedim(1, -1).contiguous().movedim(-1, 1)
    wide = torch.zeros(shape[:-1] + (2 * shape[-1],), dtype=dtype, device=device)
    wide[..., ::2] = x
    return {"contiguous": x, "channels_last": last, "strided": wide[..., ::2]}


def _args(x, seed=1):
    c, acc = x.shape[1], torch.float64 if x.dtype == torch.float64 else torch.float32
    g = torch.Generator().manual_seed(seed)
    per = [torch.randn(c, generator=g, dtype=acc).to(x.device) for _ in range(5)]
    mean, invstd, mean_dy, mean_dy_xmu, weight = per
    return dict(mean=mean, invstd=invstd.abs() + 0.5, mean_dy=mean_dy, mean_dy_xmu=mean_dy_xmu,
                weight=weight.to(x.dtype) if x.dtype != torch.float64 else weight,
                bias=torch.randn(c, generator=g).to(x.device, x.dtype))


def _samples(device):
    out = []
    for shape in [(4, 3), (2, 5, 33), (3, 4, 5, 6), (0, 3, 4)]:
        for name, x in _layouts(shape, torch.float32, device).items():
            a = _args(x)
            dy = torch.randn_like(x)
            out += [("sync_batch_norm_stats", (x,)),
                    ("sync_batch_norm_elemt", (x, a["mean"], a["invstd"], a["weight"], a["bias"])),
                    ("sync_batch_norm_elemt", (x, a["mean"], a["invstd"], None, None)),
                    ("sync_batch_norm_backward_reduce", (dy, x, a["mean"])),
                    ("sync_batch_norm_backward_elemt", (dy, x, a["mean"], a["invstd"], a["weight"],
                                                        a["mean_dy"], a["mean_dy_xmu"]))]
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    native.ensure(device)
    for name, args in _samples(device):
        torch.library.opcheck(getattr(torch.ops.core_ops, name).default, args)


def test_reference_matches_torch_batch_norm_float64():
    """The reference's forward and backward pieces, composed as SyncBatchNorm composes
    them on one rank, give torch's batch norm and its autograd grads."""
    x = torch.randn(4, 3, 5, dtype=torch.float64, requires_grad=True)
    w = torch.rand(3, dtype=torch.float64, requires_grad=True)
    b = torch.rand(3, dtype=torch.float64, requires_grad=True)
    dy = torch.randn_like(x)
    y = torch.nn.functional.batch_norm(x, None, None, w, b, training=True, eps=1e-5)
    y.backward(dy)
    mean, var = ref.sync_batch_norm_stats(x.detach())
    invstd = torch.rsqrt(var + 1e-5)
    out = ref.sync_batch_norm_elemt(x.detach(), mean, invstd, w.detach(), b.detach())
    sum_dy, sum_dy_xmu = ref.sync_batch_norm_backward_reduce(dy, x.detach(), mean)
    n = x.numel() // x.shape[1]
    dx = ref.sync_batch_norm_backward_elemt(dy, x.detach(), mean, invstd, w.detach(),
                                            sum_dy / n, sum_dy_xmu / n)
    torch.testing.assert_close(out, y.detach(), rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(dx, x.grad, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(sum_dy_xmu * invstd, w.grad, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(sum_dy, b.grad, rtol=1e-13, atol=1e-13)


# Note [Native vs reference tolerances]: both accumulate in float32 (float64) but in a
# different order (Welford per vector lane and per thread, merged), so per-channel
# statistics of ~1000 values agree to ~1e-6 relative in float32; elementwise outputs
# differ by those statistics' rounding plus one rounding of the output dtype.
NATIVE_TOL = {torch.float64: 1e-12, torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16],
                         ids=dtype_id)
@pytest.mark.parametrize("shape", [(7, 3), (2, 9, 37), (3, 4, 5, 6), (2, 17, 3, 2, 5), (0, 3, 4)])
def test_native_matches_reference(device, dtype, shape):
    native.ensure(device)
    tol = NATIVE_TOL[dtype]
    for layout, x in _layouts(shape, dtype, device).items():
        a = _args(x)
        dy = _layouts(shape, dtype, device, seed=5)[layout]
        got = [OPS.sync_batch_norm_stats(x),
               OPS.sync_batch_norm_elemt(x, a["mean"], a["invstd"], a["weight"], a["bias"]),
               OPS.sync_batch_norm_elemt(x, a["mean"], a["invstd"], None, None),
               OPS.sync_batch_norm_backward_reduce(dy, x, a["mean"]),
               OPS.sync_batch_norm_backward_elemt(dy, x, a["mean"], a["invstd"], a["weight"],
                                                  a["mean_dy"], a["mean_dy_xmu"])]
        want = [ref.sync_batch_norm_stats(x),
                ref.sync_batch_norm_elemt(x, a["mean"], a["invstd"], a["weight"], a["bias"]),
                ref.sync_batch_norm_elemt(x, a["mean"], a["invstd"], None, None),
                ref.sync_batch_norm_backward_reduce(dy, x, a["mean"]),
                ref.sync_batch_norm_backward_elemt(dy, x, a["mean"], a["invstd"], a["weight"],
                                                   a["mean_dy"], a["mean_dy_xmu"])]
        for k, (g, w) in enumerate(zip(got, want)):
            for gt, wt in zip(g if isinstance(g, tuple) else (g,), w if isinstance(w, tuple) else (w,)):
                assert gt.dtype == wt.dtype and gt.shape == wt.shape and gt.stride() == wt.stride()
                scale = max(1.0, wt.double().abs().max().item()) if wt.numel() else 1.0
                err = (gt.double() - wt.double()).abs().max().item() if wt.numel() else 0.0
                assert err <= tol * scale, (layout, k, err)


def test_bad_arguments_are_named():
    x = torch.randn(2, 3)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        OPS.sync_batch_norm_stats(torch.randn(3))
    with pytest.raises(ValueError, match="mean must be a \\(3,\\) torch.float32"):
        OPS.sync_batch_norm_elemt(x, torch.zeros(4), torch.ones(3), None, None)
    with pytest.raises(ValueError, match="weight must be a \\(3,\\)"):
        OPS.sync_batch_norm_elemt(x, torch.zeros(3), torch.ones(3), torch.ones(2), None)
    with pytest.raises(ValueError, match="grad_out has shape"):
        OPS.sync_batch_norm_backward_reduce(torch.randn(2, 4), x, torch.zeros(3))
