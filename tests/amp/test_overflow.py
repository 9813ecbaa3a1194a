"""An inf or nan gradient skips the step: the scale halves, and params, masters and
optimizer state (step counts included) are untouched, for every fused optimizer of the
registry (tests/optimizers/optimizer_registry.py, generic test "amp_overflow"; Apex's
BERT recipe is FusedLAMB under amp, which clips by norm inside step()) and for torch's,
on each device."""

import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from amp_cases import HALVES, batches, conv_net, inject, optimizer_state, train
from conftest import dtype_id
from core_ops import amp
from core_ops.optimizers import FusedAdam, FusedSGD

sys.path.insert(0, str(Path(__file__).parents[1] / "optimizers"))
from optim_cases import DEVICES  # noqa: E402
from optimizer_registry import cases  # noqa: E402

TORCH_OPTIMIZERS = {
    "torch_SGD": lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9),
    "torch_AdamW_fused": lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True),
}
OPTIMIZERS = [*cases("amp_overflow"), *(pytest.param(make, id=name) for name, make in TORCH_OPTIMIZERS.items())]
DATA = batches(4)


def make_optimizer(case, params):
    """A registry entry's typical optimizer, or a torch one."""
    return case(params) if callable(case) else case.make(params)


@pytest.mark.parametrize("bad", [-math.inf, math.nan], ids=["-inf", "nan"])
@pytest.mark.parametrize("half", HALVES, ids=dtype_id)
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("level", ["O1", "O2"])
@pytest.mark.parametrize("device", DEVICES)
def test_overflow_skips_step(device, level, optimizer, half, bad):
    model = conv_net().to(device)
    opt = make_optimizer(optimizer, model.parameters())
    model, opt = amp.initialize(model, opt, opt_level=level, half_dtype=half, verbosity=0)
    data = [(x.to(device), y.to(device)) for x, y in DATA]
    train(model, opt, data[:2])
    params = [p.detach().clone() for p in model.parameters()]
    masters = [p.detach().clone() for p in amp.master_params(opt)]
    state = optimizer_state(opt)
    scale = amp.state_dict()["loss_scaler0"]["loss_scale"]

    x, y = data[2]
    opt.zero_grad()
    with amp.scale_loss(F.cross_entropy(model(x), y), opt) as scaled:
        scaled.backward()
        inject(model, bad, index=3)
    opt.step()

    assert amp.state_dict()["loss_scaler0"] == {"loss_scale": scale / 2, "unskipped": 0, "opt_level": level,
                                                "dynamic": True}
    assert all(torch.equal(a, b) for a, b in zip(params, model.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(masters, amp.master_params(opt)))
    after = optimizer_state(opt)
    assert after.keys() == state.keys()
    assert all(torch.equal(after[k], state[k]) for k in state), [k for k in state
                                                                 if not torch.equal(after[k], state[k])]
    assert amp.state_dict()["loss_scaler0"]["loss_scale"] == scale / 2
    # The next clean step trains again.
    train(model, opt, data[3:])
    assert not torch.equal(params[0], model[0].weight)


def test_static_scale_skips_but_keeps_scale():
    model = conv_net()
    opt = FusedAdam(model.parameters(), lr=1e-3)
    model, opt = amp.initialize(model, opt, opt_level="O2", loss_scale=128.0, verbosity=0)
    w = model[0].weight.detach().clone()
    x, y = DATA[0]
    with amp.scale_loss(F.cross_entropy(model(x), y), opt) as scaled:
        assert scaled.item() == pytest.approx(128.0 * F.cross_entropy(model(x), y).item(), rel=1e-3)
        scaled.backward()
        inject(model, math.nan)
    opt.step()
    assert torch.equal(w, model[0].weight)
    assert amp.state_dict()["loss_scaler0"]["loss_scale"] == 128.0


def test_overflow_in_one_of_two_losses_skips_the_step():
    model = conv_net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O2", num_losses=2, verbosity=0)
    w = model[0].weight.detach().clone()
    x, y = DATA[0]
    with amp.scale_loss(F.cross_entropy(model(x), y), opt, loss_id=0) as scaled:
        scaled.backward()
    with amp.scale_loss(model(x).pow(2).mean(), opt, loss_id=1) as scaled:
        scaled.backward()
        inject(model, math.inf)
    opt.step()
    assert torch.equal(w, model[0].weight)
    sd = amp.state_dict()
    assert sd["loss_scaler0"] == {"loss_scale": 2.0**16, "unskipped": 1, "opt_level": "O2", "dynamic": True}
    assert sd["loss_scaler1"] == {"loss_scale": 2.0**15, "unskipped": 0, "opt_level": "O2", "dynamic": True}
    # The public readers, and Apex's logging idiom.
    assert (amp.loss_scale(), amp.skipped_steps()) == (2.0**16, 0)
    assert (amp.loss_scale(loss_id=1), amp.skipped_steps(loss_id=1)) == (2.0**15, 1)
    assert amp._amp_state.loss_scalers[1].loss_scale() == 2.0**15
    assert amp._amp_state.opt_properties.opt_level == "O2"
    with pytest.raises(ValueError, match=r"loss_id must be in \[0, 2\)"):
        amp.loss_scale(loss_id=2)


@pytest.mark.parametrize("make", [TORCH_OPTIMIZERS["torch_SGD"], lambda ps: FusedSGD(ps, lr=0.01, momentum=0.9)],
                         ids=["torch_SGD", "FusedSGD"])
def test_overflow_in_one_optimizer_skips_all_of_that_loss(make):
    # Apex skipped every optimizer passed to scale_loss, not only the one whose grads
    # overflowed: the iteration is lost as a whole (the scale halves for both).
    a, b = conv_net(), conv_net(seed=1)
    opts = [make(a.parameters()), make(b.parameters())]
    [a, b], opts = amp.initialize([a, b], opts, opt_level="O1", verbosity=0)
    wa, wb = a[0].weight.detach().clone(), b[0].weight.detach().clone()
    x, y = DATA[0]
    with amp.scale_loss(F.cross_entropy(a(x), y) + F.cross_entropy(b(x), y), opts) as scaled:
        scaled.backward()
        inject(b, math.inf)
    for opt in opts:
        opt.step()
    assert torch.equal(wa, a[0].weight) and torch.equal(wb, b[0].weight)
    assert amp.state_dict()["loss_scaler0"] == {"loss_scale": 2.0**15, "unskipped": 0, "opt_level": "O1",
                                                "dynamic": True}
    # The flag is spent by the skipped step: the next iteration trains both.
    train(a, opts[0], DATA[1:2])
    train(b, opts[1], DATA[1:2])
    assert not torch.equal(wa, a[0].weight) and not torch.equal(wb, b[0].weight)
