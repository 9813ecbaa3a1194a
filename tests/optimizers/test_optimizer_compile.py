"""torch.compile of every fused optimizer's step (optimizer_registry.py, generic test
"compile"), in each of its variants, on each device: the step traces as one graph (no
graph break, ``torch._dynamo.explain``), and the compiled step, given a grad scale and
an overflow flag, steps as eager does.

Compiled with the aot_eager backend: it runs dynamo and AOTAutograd over the ops' fake
kernels (what breaks graphs) and then eager's kernels in eager's order, so the results
are equal bit for bit. The whole amp train step compiled: tests/amp/test_compile.py."""

import pytest
import torch
from optim_cases import DEVICES
from optimizer_registry import cases


def params_with_grads(dtype, seed, device):
    g = torch.Generator().manual_seed(seed)
    ps = [torch.randn(n, generator=g).to(device, dtype).requires_grad_() for n in (300, 40)]
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g).to(device, dtype)
    return ps


def breaks(fn):
    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)()
    return explained.graph_count, [str(b.reason).splitlines()[0] for b in explained.break_reasons]


@pytest.mark.parametrize("info,config", cases("compile", variants=True))
@pytest.mark.parametrize("device", DEVICES)
def test_every_fused_optimizer_step_traces_as_one_graph_and_steps_as_eager(device, info, config):
    eager_ps, compiled_ps = (params_with_grads(config.dtype, 0, device) for _ in range(2))
    eager, compiled = info.make(eager_ps, config), info.make(compiled_ps, config)
    eager.step(), compiled.step()  # state made outside the graph, as after a first step
    assert breaks(compiled.step) == (1, [])  # explain runs the step: so does the eager one
    eager.step()
    torch._dynamo.reset()
    step = torch.compile(compiled.step, backend="aot_eager", fullgraph=True)
    scale, found_inf = torch.tensor([4.0], device=device), torch.zeros(1, device=device)
    for seed in (1, 2):
        for ps in (eager_ps, compiled_ps):
            for p, q in zip(ps, params_with_grads(config.dtype, seed, device)):
                p.grad = q.grad * 4
        eager.step(grad_scale=scale, found_inf=found_inf)
        step(grad_scale=scale, found_inf=found_inf)
    for p, q in zip(eager_ps, compiled_ps):
        assert torch.equal(p, q)
