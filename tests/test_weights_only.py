"""Every state core-ops saves loads with ``torch.load(weights_only=True)``: no pickled
classes in a checkpoint (amp's and AmpLoop's state, the loss scaler, each fused
optimizer's state in every layout), and what loads is what was saved."""

import io

import pytest
import torch
from torch import nn

from core_ops import amp
from core_ops.amp import AmpLoop, LossScaler
from core_ops.optimizers import FusedAdagrad, FusedAdam, FusedLAMB, FusedMixedPrecisionLamb, FusedNovoGrad, FusedSGD


def round_trip(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b or (a != a and b != b)


OPTIMIZERS = {
    "adam": (lambda ps: FusedAdam(ps, lr=1e-3, skip_nonfinite=True), torch.float32),
    "adam-capturable": (lambda ps: FusedAdam(ps, lr=1e-3, capturable=True), torch.float32),
    "adam-masters": (lambda ps: FusedAdam(ps, lr=1e-3, master_weights=True), torch.bfloat16),
    "adam-remainders-8bit": (lambda ps: FusedAdam(ps, lr=1e-3, master_weights="remainder", state_dtype="int8",
                                                  min_8bit_size=1), torch.bfloat16),
    "adam-bf16-moments": (lambda ps: FusedAdam(ps, lr=1e-3, state_dtype=torch.bfloat16), torch.float32),
    "sgd": (lambda ps: FusedSGD(ps, lr=0.1, momentum=0.9), torch.float32),
    "lamb": (lambda ps: FusedLAMB(ps, lr=1e-3), torch.float32),
    "mixed-lamb": (lambda ps: FusedMixedPrecisionLamb(ps, lr=1e-3, reduced_precision_dtype=torch.bfloat16),
                   torch.bfloat16),
    "novograd": (lambda ps: FusedNovoGrad(ps, lr=1e-3), torch.float32),
    "adagrad": (lambda ps: FusedAdagrad(ps, lr=0.1), torch.float32),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_every_fused_optimizer_state_dict_loads_weights_only(name):
    make, dtype = OPTIMIZERS[name]
    g = torch.Generator().manual_seed(0)
    ps = [torch.randn(n, generator=g).to(dtype).requires_grad_() for n in (300, 40)]
    opt = make(ps)
    for _ in range(2):
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g).to(dtype)
        opt.step()
    saved = opt.state_dict()
    loaded = round_trip(saved)
    assert same(saved, loaded)
    twin_ps = [p.detach().clone().requires_grad_() for p in ps]
    twin = make(twin_ps)
    twin.load_state_dict(loaded)  # and it resumes: one more step of each is the same step
    for p, q in zip(ps, twin_ps):
        p.grad = q.grad = torch.randn(p.shape, generator=g).to(dtype)
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
