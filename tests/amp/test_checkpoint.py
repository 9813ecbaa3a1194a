"""Checkpoint mid-training at every level and resume in a fresh model, optimizer and
amp state: the continued run is bit-identical to the uninterrupted one."""

import io
import math

import pytest
import torch
import torch.nn.functional as F

from amp_cases import HALVES, LEVELS, batches, conv_net, inject, train
from conftest import dtype_id
from core_ops import amp
from core_ops.optimizers import FusedAdam

DATA = batches(8)
OPTIMIZERS = {"FusedAdam": lambda ps: FusedAdam(ps, lr=3e-3),
              "torch_SGD": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)}


def fresh(level, half, opt_name):
    model = conv_net(seed=11)  # other initial weights: the checkpoint must overwrite them
    opt = OPTIMIZERS[opt_name](model.parameters())
    return amp.initialize(model, opt, opt_level=level, half_dtype=half, verbosity=0)


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("half", HALVES, ids=dtype_id)
@pytest.mark.parametrize("level", LEVELS)
def test_resume_is_bit_identical(level, half, opt_name):
    model = conv_net()
    opt = OPTIMIZERS[opt_name](model.parameters())
    model, opt = amp.initialize(model, opt, opt_level=level, half_dtype=half, verbosity=0)
    train(model, opt, DATA[:3])
    if level in ("O1", "O2"):  # move the loss scale off its initial value
        x, y = DATA[3]
        with amp.scale_loss(F.cross_entropy(model(x), y), opt) as scaled:
            scaled.backward()
            inject(model, math.inf)
        opt.step()
        opt.zero_grad()
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                "amp": amp.state_dict()}, buffer)
    expected = train(model, opt, DATA[4:])
    expected_params = [p.detach().clone() for p in model.parameters()]
    expected_amp = amp.state_dict()

    buffer.seek(0)
    ckpt = torch.load(buffer)
    model, opt = fresh(level, half, opt_name)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    amp.load_state_dict(ckpt["amp"])
    assert train(model, opt, DATA[4:]) == expected
    assert all(torch.equal(a, b) for a, b in zip(expected_params, model.parameters()))
    assert amp.state_dict() == expected_amp


def test_amp_state_dict_mismatch():
    # As Apex: a different number of scalers warns and loads those that match.
    fresh("O1", torch.float16, "FusedAdam")
    with pytest.warns(UserWarning, match="has 2 loss scalers but amp.initialize made 1"):
        amp.load_state_dict({"loss_scaler0": {"loss_scale": 256.0, "unskipped": 7},
                             "loss_scaler1": {"loss_scale": 1.0, "unskipped": 0}})
    O1 = {"opt_level": "O1", "dynamic": True}
    assert amp.state_dict() == {"loss_scaler0": {"loss_scale": 256.0, "unskipped": 7, **O1}}
    model = conv_net()
    amp.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), opt_level="O1",
                   num_losses=2, verbosity=0)
    with pytest.warns(UserWarning, match="has 1 loss scalers but amp.initialize made 2"):
        amp.load_state_dict({"loss_scaler0": {"loss_scale": 8.0, "unskipped": 3}})
    assert amp.state_dict() == {"loss_scaler0": {"loss_scale": 8.0, "unskipped": 3, **O1},
                                "loss_scaler1": {"loss_scale": 2.0**16, "unskipped": 0, **O1}}
    with pytest.raises(RuntimeError, match=r"unexpected keys in the amp state dict: \['scale'\]"):
        amp.load_state_dict({"scale": 1.0})


def test_a_state_of_another_opt_level_warns_as_in_the_plugins():
    # Apex's files name no level and load silently; ours name theirs. O2 -> O1: both scale
    # dynamically, the scaler carries over with a warning; O2 -> O3 (static scale 1):
    # it does not apply and is left out, with a warning.
    fresh("O2", torch.float16, "FusedAdam")
    saved = amp.state_dict()
    saved["loss_scaler0"]["loss_scale"] = 512.0
    fresh("O1", torch.float16, "FusedAdam")
    with pytest.warns(UserWarning, match="amp state of an O2 run into O1: loss scaler 0 carries over"):
        amp.load_state_dict(saved)
    assert amp.state_dict()["loss_scaler0"]["loss_scale"] == 512.0
    fresh("O3", torch.float16, "FusedAdam")
    with pytest.warns(UserWarning, match="O2 run into O3: loss scaler 0 does not apply here and is left out"):
        amp.load_state_dict(saved)
    assert amp.state_dict()["loss_scaler0"]["loss_scale"] == 1.0
    fresh("O1", torch.float16, "FusedAdam")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Apex's own format: no level, no warning
        amp.load_state_dict({"loss_scaler0": {"loss_scale": 64.0, "unskipped": 2}})
    assert amp.state_dict()["loss_scaler0"]["loss_scale"] == 64.0
