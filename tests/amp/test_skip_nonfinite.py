"""skip_nonfinite (Note [Skipping non-finite steps]): at O0 and O3, where Apex's static
scale of 1 checks nothing, a NaN or inf grad skips the step (params and optimizer
state untouched, counted in skipped_steps) and training goes on, through
``amp.initialize`` + ``scale_loss`` and through ``AmpLoop``, on each device, with every
fused optimizer of the registry (tests/optimizers/optimizer_registry.py, generic test
"amp_skip_nonfinite": the flag read in its step, no host read) and with a torch one.
Off (the default, as Apex), the NaN reaches the weights."""

import re
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from core_ops import amp
from core_ops.amp import AmpLoop
from core_ops.optimizers import FusedAdam

sys.path.insert(0, str(Path(__file__).parents[1] / "optimizers"))
from optim_cases import DEVICES  # noqa: E402
from optimizer_registry import OPTIMIZERS, cases  # noqa: E402

OPTIMIZER_CASES = [*(case.values[0] for case in cases("amp_skip_nonfinite")), "torch_sgd"]
CASES = [(level, half, opt) for level in ("O0", "O3") for half in (torch.bfloat16, torch.float16)
         for opt in OPTIMIZER_CASES]
BAD_STEP = 2


def make(optimizer, device="cpu"):
    """A small model on ``device`` and ``optimizer`` over it: a registry entry's typical
    one, or "torch_sgd"."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(device)
    if optimizer == "torch_sgd":
        return model, torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    return model, optimizer.make(model.parameters())


def batch(k, device="cpu"):
    g = torch.Generator().manual_seed(k)
    return torch.randn(4, 8, generator=g).to(device), torch.randn(4, 4, generator=g).to(device)


def snapshot(model, opt):
    state = [v.clone() for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return [p.detach().clone() for p in model.parameters()], state


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b)) and len(a) == len(b)


def step(loss, opt, loop=None):
    """One optimizer step on ``loss``: through scale_loss, or through ``loop`` (AmpLoop)."""
    if loop is None:
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
    else:
        loop.scale(loss).backward()
        loop.step(opt)
        loop.update()


def train(route, level, half, optimizer, skip, device="cpu"):
    """Four steps, the loss NaN at BAD_STEP: (params and state before and after it,
    whether the end is finite, skipped steps)."""
    model, opt = make(optimizer, device)
    loop = None
    if route == "initialize":
        model, opt = amp.initialize(model, opt, opt_level=level, half_dtype=half, verbosity=0,
                                    skip_nonfinite=skip)
    else:
        loop = AmpLoop(level, half_dtype=half, skip_nonfinite=skip)
        model = loop.prepare_model(model)
        loop.attach(opt)
    around = {}
    for k in range(4):
        x, y = batch(k, device)
        loss = F.mse_loss(model(x.to(next(model.parameters()).dtype)).float(), y)
        if k == BAD_STEP:
            loss = loss * float("nan")
            around["before"] = snapshot(model, opt)
        step(loss, opt, loop)
        if k == BAD_STEP:
            around["after"] = snapshot(model, opt)
        opt.zero_grad()
    finite = all(torch.isfinite(p).all() for p in model.parameters())
    skipped = amp.skipped_steps() if route == "initialize" else loop.scaler.skipped_steps
    return around, finite, skipped


@pytest.mark.parametrize("route", ["initialize", "loop"])
@pytest.mark.parametrize("level,half,optimizer", CASES,
                         ids=[f"{lv}-{str(h)[6:]}-{getattr(o, 'name', o)}" for lv, h, o in CASES])
@pytest.mark.parametrize("device", DEVICES)
def test_a_nan_step_is_skipped_at_static_levels(device, route, level, half, optimizer):
    around, finite, skipped = train(route, level, half, optimizer, skip=True, device=device)
    assert same(around["before"][0], around["after"][0])  # params
    assert same(around["before"][1], around["after"][1])  # optimizer state, steps included
    assert finite and skipped == 1


@pytest.mark.parametrize("route", ["initialize", "loop"])
def test_off_by_default_the_nan_reaches_the_weights_as_in_apex(route):
    _, finite, skipped = train(route, "O3", torch.bfloat16, OPTIMIZERS["adam"], skip=None)
    assert not finite and skipped == 0


def test_skip_nonfinite_takes_only_a_switch():
    model, opt = make(OPTIMIZERS["adam"])
    with pytest.raises(ValueError, match="skip_nonfinite='maybe': expected one of 1, true, yes, on, 0"):
        amp.initialize(model, opt, opt_level="O0", skip_nonfinite="maybe", verbosity=0)


# ---- max_consecutive_skips and the grad report -----------------------------------------

class Named(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Linear(8, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(torch.relu(self.encoder(x)))


def poisoned_loss(model, k):
    """A loss whose grads are inf in the head's bias only (its grad is the loss's)."""
    x, y = batch(k)
    out = model(x.to(model.head.weight.dtype)).float()
    return F.mse_loss(out, y) + (model.head.bias.float() * torch.tensor([float("inf"), 0, 0, 0])).sum()


@pytest.mark.parametrize("route", ["initialize", "loop"])
@pytest.mark.parametrize("level", ["O2", "O3"])
def test_persistent_skips_stop_the_run_naming_the_tensor(route, level):
    model = Named()
    opt = FusedAdam(model.parameters(), lr=1e-2)
    options = dict(opt_level=level, half_dtype=torch.bfloat16, skip_nonfinite=True, max_consecutive_skips=3)
    loop = None
    if route == "initialize":
        model, opt = amp.initialize(model, opt, verbosity=0, **options)
    else:
        loop = AmpLoop(options.pop("opt_level"), **options)
        model = loop.prepare_model(model)
        loop.attach(opt)
    steps = 0
    with pytest.raises(amp.NonFiniteTraining) as stopped:
        for k in range(10):
            loss = poisoned_loss(model, k)
            step(loss, opt, loop)
            steps += 1
            opt.zero_grad()
    assert steps == 2  # the third skip in a row raises
    message = str(stopped.value)
    assert "3 steps in a row were skipped" in message and "max_consecutive_skips=3" in message
    assert "1 of 4 grads hold an inf or nan: head.bias (4,): 1 of 4 non-finite" in message, message


def test_a_healthy_run_with_a_few_skips_goes_on():
    model = Named()
    opt = FusedAdam(model.parameters(), lr=1e-2)
    model, opt = amp.initialize(model, opt, opt_level="O3", half_dtype=torch.bfloat16, verbosity=0,
                                skip_nonfinite=True, max_consecutive_skips=2)
    for k in range(8):  # skipped at 1 and at 4: never two in a row
        x, y = batch(k)
        loss = F.mse_loss(model(x.to(torch.bfloat16)).float(), y) * (float("inf") if k in (1, 4) else 1.0)
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
        opt.zero_grad()
    assert amp.skipped_steps() == 2


def test_grad_report_names_each_grad_on_demand():
    model = Named()
    opt = FusedAdam(model.parameters(), lr=1e-2)
    model, opt = amp.initialize(model, opt, opt_level="O2", half_dtype=torch.bfloat16, verbosity=0)
    with amp.scale_loss(poisoned_loss(model, 0), opt) as scaled:
        scaled.backward()
    rows = {r["name"]: r for r in amp.grad_report()}
    assert set(rows) == {"encoder.weight", "encoder.bias", "head.weight", "head.bias"}
    assert rows["head.bias"]["nonfinite"] == 1 and rows["encoder.weight"]["nonfinite"] == 0
    # The finite part of head.bias's grad: the master's unscaled grad, as the step reads it.
    master_grad = opt.param_groups[0]["params"][3].grad
    assert rows["head.bias"]["max_abs_finite"] == float(master_grad[1:].abs().max())
    assert rows["encoder.weight"]["max_abs_finite"] > 0


@pytest.mark.parametrize("bad", [-1, 2.5, True, "many"])
def test_max_consecutive_skips_takes_a_count(bad):
    with pytest.raises(ValueError, match=re.escape(f"max_consecutive_skips={bad!r}: expected an int >= 1, or 0 to "
                                                   "never stop")):
        AmpLoop("O2", max_consecutive_skips=bad)
