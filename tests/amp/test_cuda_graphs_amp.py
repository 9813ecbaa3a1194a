"""The whole O2 train step in a CUDA graph (GPU machines only; issue 35): forward,
``scale_loss`` backward and FusedAdam(capturable=True)'s step captured once by hand
(``torch.cuda.graph``, as MLPerf code does) and under ``torch.compile(mode=
"reduce-overhead")``; replays train as eager steps and an overflow inside a replay
skips that step (weights unchanged, the scale backs off). Nothing in the step syncs
the host (Note [amp's flag in the step]), which capture requires.

Tolerance: a replay runs the captured kernels, but cuBLAS may pick other algorithms
under capture than eagerly, so weights are compared within a few half-precision
roundings (rtol 2e-2) after 6 steps; a skipped replay is compared exactly."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from compile_cases import TRACES_BACKWARD
from core_ops import amp
from core_ops.optimizers import FusedAdam

pytestmark = pytest.mark.gpu

STEPS, OVERFLOW_AT = 6, 3


def prepared(half):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 8)).cuda()
    opt = FusedAdam(model.parameters(), lr=1e-3, capturable=True)
    model, opt = amp.initialize(model, opt, opt_level="O2", half_dtype=half, verbosity=0)
    return model, opt


def batch(k):
    g = torch.Generator().manual_seed(k)
    boost = float("inf") if k == OVERFLOW_AT else 1.0
    return torch.randn(32, 64, generator=g).cuda(), torch.randn(32, 8, generator=g).cuda(), torch.tensor(boost).cuda()


def step_of(model, opt):
    # No zero_grad: at O2 each scale_loss backward replaces the masters' grads (Note [O2
    # master weights]), so the grads live at fixed addresses across replays.
    def step(x, y, boost):
        loss = F.mse_loss(model(x).float(), y) * boost
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
        return loss.detach()
    return step


def eager_run(half):
    model, opt = prepared(half)
    step = step_of(model, opt)
    losses = [step(*batch(k)) for k in range(STEPS)]
    return [p.detach().clone() for p in model.parameters()], torch.stack(losses), amp.state_dict()


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_the_whole_o2_step_captured_by_hand_replays_and_skips_an_overflow(half):
    expected = eager_run(half)
    model, opt = prepared(half)
    step = step_of(model, opt)
    x, y, boost = (t.clone() for t in batch(0))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: state, masters' grads, the scaler's tensors
        first = step(x, y, boost)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = step(x, y, boost)
    losses = [first]
    for k in range(1, STEPS):
        for static, value in zip((x, y, boost), batch(k)):
            static.copy_(value)
        before = [p.detach().clone() for p in model.parameters()]
        graph.replay()
        losses.append(static_loss.clone())
        if k == OVERFLOW_AT:
            assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    torch.cuda.synchronize()
    assert amp.state_dict() == expected[2]  # the same scale and skip count as eager
    torch.testing.assert_close(torch.stack(losses), expected[1], rtol=2e-2, atol=1e-3)
    for p, q in zip(model.parameters(), expected[0]):
        torch.testing.assert_close(p.detach(), q, rtol=2e-2, atol=1e-3)


@pytest.mark.skipif(not TRACES_BACKWARD, reason="torch 2.10 has no trace_autograd_ops: backward() breaks the graph")
def test_the_whole_o2_step_under_reduce_overhead_trains_as_eager_and_skips_an_overflow():
    from torch._dynamo.utils import counters
    expected = eager_run(torch.bfloat16)
    torch._dynamo.reset()
    counters.clear()
    model, opt = prepared(torch.bfloat16)
    step = torch.compile(step_of(model, opt), mode="reduce-overhead", fullgraph=True)
    losses = []
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        for k in range(STEPS):
            losses.append(step(*batch(k)).clone())
    torch.cuda.synchronize()
    assert amp.state_dict() == expected[2]
    torch.testing.assert_close(torch.stack(losses), expected[1], rtol=2e-2, atol=1e-3, equal_nan=True)
    for p, q in zip(model.parameters(), expected[0]):
        torch.testing.assert_close(p.detach(), q, rtol=2e-2, atol=1e-3)
    # Inductor ran the graph as a CUDA graph, not as plain kernels (it falls back
    # silently, e.g. for an input mutated outside the graph's static addresses).
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
