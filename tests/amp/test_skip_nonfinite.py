"""skip_nonfinite (Note [Skipping non-finite steps]): at O0 and O3, where Apex's static
scale of 1 checks nothing, a NaN or inf grad skips the step (params and optimizer
state untouched, counted in skipped_steps) and training goes on, through
``amp.initialize`` + ``scale_loss`` and through ``AmpLoop``, with a fused optimizer
(the flag read in its step, no host read) and with a torch one. Off (the default, as
Apex), the NaN reaches the weights."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from core_ops import amp
from core_ops.amp import AmpLoop
from core_ops.optimizers import FusedAdam

CASES = [(level, half, opt) for level in ("O0", "O3") for half in (torch.bfloat16, torch.float16)
         for opt in ("fused_adam", "torch_sgd")]
BAD_STEP = 2


def make(opt_name):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    if opt_name == "fused_adam":
        return model, FusedAdam(model.parameters(), lr=1e-2)
    return model, torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)


def batch(k):
    g = torch.Generator().manual_seed(k)
    return torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)


def snapshot(model, opt):
    state = [v.clone() for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return [p.detach().clone() for p in model.parameters()], state


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b)) and len(a) == len(b)


def train(route, level, half, opt_name, skip):
    """Four steps, the loss NaN at BAD_STEP: (params and state before and after it,
    whether the end is finite, skipped steps)."""
    model, opt = make(opt_name)
    if route == "initialize":
        model, opt = amp.initialize(model, opt, opt_level=level, half_dtype=half, verbosity=0,
                                    skip_nonfinite=skip)
    else:
        loop = AmpLoop(level, half_dtype=half, skip_nonfinite=skip)
        model = loop.prepare_model(model)
        loop.attach(opt)
    around = {}
    for k in range(4):
        x, y = batch(k)
        loss = F.mse_loss(model(x.to(next(model.parameters()).dtype)).float(), y)
        if k == BAD_STEP:
            loss = loss * float("nan")
            around["before"] = snapshot(model, opt)
        if route == "initialize":
            with amp.scale_loss(loss, opt) as scaled:
                scaled.backward()
            opt.step()
        else:
            loop.scale(loss).backward()
            loop.step(opt)
            loop.update()
        if k == BAD_STEP:
            around["after"] = snapshot(model, opt)
        opt.zero_grad()
    finite = all(torch.isfinite(p).all() for p in model.parameters())
    skipped = amp.skipped_steps() if route == "initialize" else loop.scaler.skipped_steps
    return around, finite, skipped


@pytest.mark.parametrize("route", ["initialize", "loop"])
@pytest.mark.parametrize("level,half,opt_name", CASES,
                         ids=[f"{lv}-{str(h)[6:]}-{o}" for lv, h, o in CASES])
def test_a_nan_step_is_skipped_at_static_levels(route, level, half, opt_name):
    around, finite, skipped = train(route, level, half, opt_name, skip=True)
    assert same(around["before"][0], around["after"][0])  # params
    assert same(around["before"][1], around["after"][1])  # optimizer state, steps included
    assert finite and skipped == 1


@pytest.mark.parametrize("route", ["initialize", "loop"])
def test_off_by_default_the_nan_reaches_the_weights_as_in_apex(route):
    _, finite, skipped = train(route, "O3", torch.bfloat16, "fused_adam", skip=None)
    assert not finite and skipped == 0


def test_skip_nonfinite_takes_only_a_bool():
    model, opt = make("fused_adam")
    with pytest.raises(ValueError, match="skip_nonfinite must be True or False, got 'yes'"):
        amp.initialize(model, opt, opt_level="O0", skip_nonfinite="yes", verbosity=0)
