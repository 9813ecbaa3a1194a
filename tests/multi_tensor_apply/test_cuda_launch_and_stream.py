"""CUDA launch edge cases (GPU machines only; run by tests/gpu/run.sh):

- One launch of the multi-tensor launcher carries at most 2048 chunks of 65536
  elements (multi_tensor_apply.cuh); a tensor over that limit is split across
  launches and re-recorded with its per-tensor scalars (Adam's step counts). Adam
  on a tensor of 2^27 + 5 elements after a small one, each with its own step count,
  must equal the CPU kernel.
- Every op runs on the current CUDA stream: work queued on a side stream before the
  op (a fill behind a long sleep) is seen by it.
"""

import pytest
import torch

import core_ops
from core_ops._schemas import op

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("both_native")]


def adam_lists(device, sizes, step_counts):
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(n, generator=g).to(device) for n in sizes]
    grads = [torch.randn(n, generator=g).to(device) for n in sizes]
    m = [torch.randn(n, generator=g).mul_(0.1).to(device) for n in sizes]
    v = [torch.rand(n, generator=g).mul_(0.01).to(device) for n in sizes]
    steps = [torch.full((), float(k), device=device) for k in step_counts]
    return params, grads, m, v, steps


def test_adam_on_a_tensor_split_across_launches_matches_cpu():
    sizes, step_counts = (1000, 2**27 + 5), (3, 7)
    results = {}
    for device in ("cpu", "cuda"):
        params, grads, m, v, steps = adam_lists(device, sizes, step_counts)
        op("fused_adam_")(params, grads, m, v, [], [], steps, 1e-3, 0.9, 0.999, 1e-8, 0.01,
                          True, True, False, False, None, None, None)
        results[device] = (params, m, v, steps)
    for got, want in zip(*(results[d] for d in ("cuda", "cpu"))):
        for a, b in zip(got, want):
            # One step: nvcc's fused multiply-adds move a value by an ulp or two of its
            # own magnitude (Note [CUDA optimizer tolerances]); a wrong offset or step
            # count of the split tensor's tail would be off by far more.
            a, b = a.cpu().double(), b.double()
            tol = 4 * torch.finfo(torch.float32).eps * b.abs().max().item()
            torch.testing.assert_close(a, b, rtol=0, atol=tol)
    assert [s.item() for s in results["cuda"][3]] == [4.0, 8.0]


def queued_behind_a_sleep(fill):
    """Runs ``fill`` on a side stream behind ~0.1 s of spinning; returns the stream.
    An op that ran on another stream would read the data before the fill."""
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)
        fill()
    return side


def test_ops_run_on_the_current_stream():
    x = torch.ones(1 << 20, device="cuda")
    out = torch.empty_like(x)
    p, g = torch.zeros(1 << 16, device="cuda"), torch.zeros(1 << 16, device="cuda")
    m, v, step = torch.zeros_like(p), torch.zeros_like(p), torch.zeros((), device="cuda")
    side = queued_behind_a_sleep(lambda: (x.fill_(2.0), g.fill_(1.0)))
    with torch.cuda.stream(side):
        flag = core_ops.multi_tensor_scale([x], [out], 0.5)
        norm, _ = core_ops.multi_tensor_l2norm([x])
        mean, var = op("sync_batch_norm_stats")(x.view(1, 1, -1))
        op("fused_adam_")([p], [g], [m], [v], [], [], [step], 1e-2, 0.9, 0.999, 1e-8, 0.0,
                          True, True, False, False, None, None, None)
    side.synchronize()
    assert torch.equal(out, torch.ones_like(x)) and flag.item() == 0  # 2.0 * 0.5
    assert norm.item() == pytest.approx(2.0 * 2**10)  # sqrt(2^20 * 4)
    assert mean.item() == 2.0 and var.item() == 0.0
    assert torch.allclose(p, torch.full_like(p, -1e-2), rtol=1e-5)  # Adam's first step: -lr * sign(g)
