"""Every state core-ops saves loads with ``torch.load(weights_only=True)``: no pickled
classes in a checkpoint (amp's and AmpLoop's state, the loss scaler, each fused
optimizer's state in every layout), and what loads is what was saved."""

import io
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from core_ops import amp
from core_ops.amp import AmpLoop, LossScaler
from core_ops.optimizers import FusedAdam

sys.path.insert(0, str(Path(__file__).parent / "optimizers"))
from optim_cases import DEVICES  # noqa: E402
from optimizer_registry import cases  # noqa: E402


def round_trip(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b or (a != a and b != b)


@pytest.mark.parametrize("info,config", cases("state_dict", variants=True))
@pytest.mark.parametrize("device", DEVICES)
def test_every_fused_optimizer_state_dict_loads_weights_only(device, info, config):
    """Each optimizer of the registry (optimizer_registry.py, generic test "state_dict")
    in each of its variants, on each device; an optimizer that loads it resumes with
    the same step."""
    g = torch.Generator().manual_seed(0)
    ps = [torch.randn(n, generator=g).to(device, config.dtype).requires_grad_() for n in (300, 40)]
    opt = info.make(ps, config, skip_nonfinite=True)  # the guard's count is no state: nothing pickled
    for _ in range(2):
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g).to(device, config.dtype)
        opt.step()
    saved = opt.state_dict()
    loaded = round_trip(saved)
    assert same(saved, loaded)
    twin_ps = [p.detach().clone().requires_grad_() for p in ps]
    twin = info.make(twin_ps, config, skip_nonfinite=True)
    twin.load_state_dict(loaded)  # and it resumes: one more step of each is the same step
    for p, q in zip(ps, twin_ps):  # each its own: a step writes its grads back (unscaled, clipped)
        p.grad = torch.randn(p.shape, generator=g).to(device, config.dtype)
        q.grad = p.grad.clone()
    opt.step(), twin.step()
    for p, q in zip(ps, twin_ps):
        assert torch.equal(p, q)


@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
def test_amp_and_amp_loop_state_loads_weights_only(level):
    model = nn.Linear(8, 4)
    opt = FusedAdam(model.parameters(), lr=1e-3)
    model, opt = amp.initialize(model, opt, opt_level=level, half_dtype=torch.bfloat16, verbosity=0,
                                skip_nonfinite=True, max_consecutive_skips=5)
    with amp.scale_loss(model(torch.randn(2, 8).to(next(model.parameters()).dtype)).float().sum() * float("inf"),
                        opt) as scaled:
        scaled.backward()
    opt.step()
    assert same(amp.state_dict(), round_trip(amp.state_dict()))
    loop = AmpLoop(level, half_dtype=torch.bfloat16)
    assert same(loop.state_dict(), round_trip(loop.state_dict()))


def test_the_loss_scaler_state_loads_weights_only():
    scaler = LossScaler(init_scale=1024.0, hysteresis=2)
    scaler.update_from(torch.ones(()))
    saved = scaler.state_dict()
    assert same(saved, round_trip(saved))
