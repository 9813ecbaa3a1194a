"""A capturable step captured in a CUDA graph (GPU machines only; issue 35), for every
optimizer of the registry that takes capturable=True (optimizer_registry.py, generic
test "cuda_graphs": FusedAdam's configs, compact state included): replays step as
eager steps do, bit for bit (the same kernels: a replay reruns what the capture
recorded, with the step counts, lr tensor, grad scale and overflow flag read on the
device), and an overflow flagged before a replay makes that replay change nothing.
State is made by a step before the capture (on a side stream, as torch's CUDA-graph
recipe warms up), as a captured step cannot allocate it."""

import pytest
import torch
from optimizer_registry import cases

pytestmark = pytest.mark.gpu

SIZES = (1, 300, 65536 + 17)


def params(dtype):
    g = torch.Generator().manual_seed(0)
    ps = [torch.randn(n, generator=g).to("cuda", dtype).requires_grad_() for n in SIZES]
    for p in ps:
        p.grad = torch.zeros_like(p)
    return ps


def grads(k, dtype):
    g = torch.Generator().manual_seed(100 + k)
    return [torch.randn(n, generator=g).to("cuda", dtype) * 4 for n in SIZES]


@pytest.mark.parametrize("info,config", cases("cuda_graphs", variants=True))
def test_a_captured_step_replays_as_eager_steps(info, config):
    dtype = config.dtype
    eager_ps, graph_ps = params(dtype), params(dtype)
    lr = torch.tensor(1e-3, device="cuda")
    eager = info.make(eager_ps, config, lr=lr, capturable=True)
    captured = info.make(graph_ps, config, lr=lr, capturable=True)
    scale, found_inf = torch.tensor([4.0], device="cuda"), torch.zeros(1, device="cuda")

    def load(ps, k):
        for p, g in zip(ps, grads(k, dtype)):
            p.grad.copy_(g)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up step: makes the state
        load(graph_ps, 0)
        captured.step(grad_scale=scale, found_inf=found_inf)
    torch.cuda.current_stream().wait_stream(side)
    load(eager_ps, 0)
    eager.step(grad_scale=scale, found_inf=found_inf)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured.step(grad_scale=scale, found_inf=found_inf)
    for k in range(1, 6):
        load(eager_ps, k), load(graph_ps, k)
        found_inf.fill_(1.0 if k == 3 else 0.0)  # the third replay overflows: nothing moves
        before = [p.detach().clone() for p in graph_ps]
        eager.step(grad_scale=scale, found_inf=found_inf)
        graph.replay()
        if k == 3:
            assert all(torch.equal(a, b) for a, b in zip(before, graph_ps))
    torch.cuda.synchronize()
    for a, b in zip(eager_ps, graph_ps):
        assert torch.equal(a, b)
    for a, b in zip(eager_ps, graph_ps):
        for key, value in eager.state[a].items():
            assert torch.equal(value, captured.state[b][key]), key  # steps included: 5 of 6 taken
    assert captured.state[graph_ps[0]]["step"].item() == 5.0
