"""``amp.init()``, Apex's API from before ``initialize``: Apex's O1 cast lists while the
handle is active (and nothing after ``_deactivate``), and the handle's loss scaling."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from core_ops import amp
from core_ops.amp import _state, apex_casts


@pytest.fixture
def handle():
    h = amp.init()
    try:
        yield h
    finally:
        h._deactivate()
    assert not torch.is_autocast_enabled("cpu")


H, FL = torch.float16, torch.float32


def test_fp16_functions_run_in_half(handle):
    lin, conv = nn.Linear(8, 8), nn.Conv2d(2, 2, 3)
    for dtype in (H, FL):
        x = torch.randn(4, 8, dtype=dtype, requires_grad=True)
        y = lin(x)
        assert y.dtype == H
        y.float().sum().backward()
        assert x.grad.dtype == dtype and lin.weight.grad.dtype == FL
        assert conv(torch.randn(1, 2, 5, 5, dtype=dtype)).dtype == H
        assert (x @ torch.randn(8, 3)).dtype == H and torch.mv(torch.randn(3, 8), x[0]).dtype == H


def test_fp32_functions_run_in_float(handle):
    x = torch.randn(4, 8, dtype=H)
    for fn in (lambda x: F.softmax(x, 1), lambda x: F.group_norm(x, 2), lambda x: x.exp(), lambda x: x.sum(),
               lambda x: torch.pow(x, 2), lambda x: x ** 2, lambda x: F.mse_loss(x, torch.zeros_like(x)),
               lambda x: x.cpu()):
        assert fn(x).dtype == FL
    assert F.relu(x).dtype == H and F.relu(x.float()).dtype == FL  # not listed: the input's dtype


def test_promote_functions_take_the_widest_and_in_place_keeps_its_dtype(handle):
    h, f = torch.randn(3, dtype=H), torch.randn(3)
    assert torch.atan2(h, f).dtype == FL and (h * f).dtype == FL and torch.cat([h, h]).dtype == H
    assert torch.cat([h, f]).dtype == FL and torch.stack([f, h]).dtype == FL
    # A 0-dim float tensor widens too (torch's own promotion would keep half).
    assert (h + torch.tensor(2.0)).dtype == FL
    h2 = h.clone()
    h2.add_(f)
    assert h2.dtype == H
    with pytest.raises(NotImplementedError, match="cannot write its result into a torch.float16 tensor"):
        h.clone().exp_()
    f.exp_()  # float32 in place is fine


def test_binary_cross_entropy_is_banned_unless_allowed(handle):
    p = torch.rand(4, dtype=H)
    with pytest.raises(NotImplementedError, match="BCEWithLogitsLoss"):
        F.binary_cross_entropy(p, torch.rand(4))
    handle._deactivate()
    allowed = amp.init(allow_banned=True)
    try:
        assert nn.BCELoss()(p, torch.rand(4, dtype=H)).dtype == FL
    finally:
        allowed._deactivate()


def test_an_allowed_banned_function_runs_in_float32_outside_autocast(handle, monkeypatch):
    """CUDA's autocast raises for binary_cross_entropy whatever its input dtype, so an
    allowed banned function must run with autocast off (it failed Apex's
    test_bce_is_float_with_allow_banned on the H200). CPU autocast does not ban BCE:
    torch.mm, which CPU autocast runs in bfloat16, stands in for it here."""
    handle._deactivate()
    monkeypatch.setitem(apex_casts.RULES, torch.mm, ("banned", False))
    monkeypatch.setitem(apex_casts.BANNED, torch.mm, "mm is banned in this test")
    a, b = torch.randn(4, 4, dtype=torch.bfloat16), torch.randn(4, 4)
    want = torch.mm(a.float(), b)
    allowed = amp.init(allow_banned=True, half_dtype=torch.bfloat16)
    try:
        out = torch.mm(a, b)
        assert out.dtype == FL
        torch.testing.assert_close(out, want, rtol=0, atol=0)
        assert torch.is_autocast_enabled("cpu")  # only the banned call ran outside it
    finally:
        allowed._deactivate()


def test_rnns_and_cells_run_in_half(handle):
    lstm, cell = nn.LSTM(6, 6, num_layers=2, bidirectional=True), nn.GRUCell(6, 6)
    x = torch.randn(5, 2, 6, requires_grad=True)
    out, _ = lstm(x)
    assert out.dtype == H
    out.float().sum().backward()
    assert x.grad.dtype == FL and lstm.weight_ih_l0.grad.dtype == FL
    assert cell(torch.randn(2, 6), torch.zeros(2, 6)).dtype == H


def test_deactivate_and_disable_casts_end_the_casts():
    handle = amp.init()
    assert _state._amp_state.handle is handle and handle.is_active()
    with handle._disable_casts():
        assert F.linear(torch.randn(2, 3), torch.randn(3, 3)).dtype == FL
    assert F.linear(torch.randn(2, 3), torch.randn(3, 3)).dtype == H
    second = amp.init()  # a second init replaces the first's casts, not stacks on them
    assert not handle.is_active()
    second._deactivate()
    second._deactivate()  # idempotent
    assert F.linear(torch.randn(2, 3), torch.randn(3, 3)).dtype == FL
    assert F.softmax(torch.randn(3, dtype=H), 0).dtype == H
    assert not isinstance(_state._amp_state.handle, amp.AmpHandle)


def test_bfloat16_half_dtype():
    handle = amp.init(half_dtype=torch.bfloat16)
    try:
        assert F.linear(torch.randn(2, 3), torch.randn(3, 3)).dtype == torch.bfloat16
    finally:
        handle._deactivate()


def test_disabled_init_does_nothing():
    handle = amp.init(enabled=False)
    assert not handle.is_active() and F.linear(torch.randn(2, 3), torch.randn(3, 3)).dtype == FL
    loss = torch.tensor(2.0)
    with handle.scale_loss(loss, None) as scaled:
        assert scaled is loss


def test_scale_loss_unscales_the_grads_and_an_overflow_skips_one_step(handle):
    torch.manual_seed(0)
    model = nn.Linear(8, 2)
    reference = nn.Linear(8, 2)
    reference.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    with handle.scale_loss(model(x).float().square().mean(), opt) as scaled:
        assert float(scaled.detach()) == pytest.approx(2.0**16 * float(model(x).float().square().mean()), rel=1e-3)
        scaled.backward()
    unscaled = [p.grad.clone() for p in model.parameters()]
    reference(x).float().square().mean().backward()  # the same half forward, unscaled
    # A power-of-two scale and its inverse are exact: the same grads, bit for bit.
    assert all(torch.equal(a, b.grad) for a, b in zip(unscaled, reference.parameters()))
    opt.step()
    before = [p.clone() for p in model.parameters()]
    opt.zero_grad()
    with handle.scale_loss(model(x).float().sum() * math.inf, opt) as scaled:
        scaled.backward()
    assert handle.loss_scale == 2.0**15
    opt.step()  # skipped
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    opt.zero_grad()
    with handle.scale_loss(model(x).float().square().mean(), opt) as scaled:
        scaled.backward()
    opt.step()  # the step after runs again
    assert not torch.equal(before[0], model.weight)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="loss_scale must be 'dynamic' or a number > 0"):
        amp.init(loss_scale=-1)
    with pytest.raises(ValueError, match="half_dtype must be"):
        amp.init(half_dtype=torch.float64)
    handle = amp.init()
    try:
        with pytest.raises(NotImplementedError, match="amp.initialize"):
            handle.wrap_optimizer(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1))
    finally:
        handle._deactivate()
