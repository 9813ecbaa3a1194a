"""Note [Norms under inductor]: compiled by inductor, FusedRMSNorm, FusedLayerNorm and
fused_add_rms_norm become inductor's own generated code (the references in its
decomposition table; no call of a core_ops op is left), forward and backward equal
eager within float32 roundings (inductor orders the reductions its own way: 1e-5
relative on values of order 1, fp32 inputs); other backends keep the custom ops."""

import pytest
import torch
from torch import nn

from core_ops.normalization import FusedLayerNorm, FusedRMSNorm, fused_add_rms_norm

pytestmark = pytest.mark.inductor_cpu


class AddNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, 64))

    def forward(self, x):
        y, h = fused_add_rms_norm(x, x * 0.5, self.weight)
        return y + h


@pytest.mark.parametrize("norm", [lambda: FusedRMSNorm(64), lambda: FusedLayerNorm(64), AddNorm],
                         ids=["rms", "layer", "add_rms"])
def test_inductor_generates_the_norms_and_matches_eager(norm, tmp_path, monkeypatch):
    from torch._inductor.utils import run_and_get_code
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), norm(), nn.GELU())
    x = torch.randn(32, 64, requires_grad=True)
    runs = []
    for compiled in (False, True):
        run = torch.compile(model) if compiled else model
        out, code = run_and_get_code(lambda: run(x)) if compiled else (run(x), [])
        out.square().sum().backward()
        runs.append((out.detach(), [p.grad.clone() for p in model.parameters()], x.grad.clone(), code))
        model.zero_grad()
        x.grad = None
    (eager, eager_grads, eager_dx, _), (comp, comp_grads, comp_dx, code) = runs
    assert code and not any("core_ops" in c for c in code)  # generated, not a call of our op
    torch.testing.assert_close(comp, eager, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(comp_dx, eager_dx, rtol=1e-5, atol=1e-5)
    for a, b in zip(comp_grads, eager_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)  # summed over 32 rows
