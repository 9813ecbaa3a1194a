"""Apex's internals that training scripts reach into, as NVIDIA's DeepLearningExamples
BERT run_pretraining.py does (and the many scripts copied from it): the loss scaler's
``_loss_scale``, ``update_scale()`` and ``_overflow_buf``, ``scale_loss(...,
delay_overflow_check=True)``, and the optimizer's ``_lazy_init_maybe_master_weights``
/ ``_amp_stash`` on resume."""

import math

import torch

from amp_cases import batches, conv_net, inject
from core_ops import amp
from core_ops.amp import _amp_state
from core_ops.optimizers import FusedLAMB

DATA = batches(2)


def setup():
    model = conv_net()
    opt = FusedLAMB(model.parameters(), lr=1e-3)
    return amp.initialize(model, opt, opt_level="O2", verbosity=0)


def test_setting_loss_scale_attribute_sets_the_scale():
    model, opt = setup()
    _amp_state.loss_scalers[0]._loss_scale = 2.0**20
    assert amp.loss_scale() == 2.0**20
    loss = model(DATA[0][0]).float().mean()
    with amp.scale_loss(loss, opt) as scaled:
        assert torch.equal(scaled, loss.float() * 2.0**20)


def test_delay_overflow_check_leaves_the_decision_to_the_caller():
    model, opt = setup()
    scaler = _amp_state.loss_scalers[0]
    x, _ = DATA[0]
    with amp.scale_loss(model(x).float().mean(), opt, delay_overflow_check=True) as scaled:
        scaled.backward()
        inject(model, math.inf)
    assert amp.loss_scale() == 2.0**16  # not updated by scale_loss
    assert opt._amp_stash.found_inf is None  # the step would not be skipped by amp
    assert scaler.update_scale() is True  # the caller's check: skip, and back off
    assert amp.loss_scale() == 2.0**15
    opt.zero_grad()
    with amp.scale_loss(model(x).float().mean(), opt, delay_overflow_check=True) as scaled:
        scaled.backward()
    assert scaler.update_scale() is False and amp.loss_scale() == 2.0**15


def test_resume_as_nvidia_bert_does(tmp_path):
    model, opt = setup()
    x, _ = DATA[0]
    with amp.scale_loss(model(x).float().mean(), opt) as scaled:
        scaled.backward()
    opt.step()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                "master params": list(amp.master_params(opt))}, tmp_path / "ckpt.pt")
    checkpoint = torch.load(tmp_path / "ckpt.pt", weights_only=False)

    model2, opt2 = setup()
    model2.load_state_dict(checkpoint["model"])
    opt2._lazy_init_maybe_master_weights()
    opt2._amp_stash.lazy_init_called = True
    opt2.load_state_dict(checkpoint["optimizer"])
    for param, saved in zip(amp.master_params(opt2), checkpoint["master params"]):
        param.data.copy_(saved.data)
    assert all(torch.equal(a, b) for a, b in zip(amp.master_params(opt2), amp.master_params(opt)))
    assert [p.shape for p in opt2._amp_stash.all_fp32_from_fp16_params] == \
        [p.shape for p in opt2._amp_stash.all_fp16_params]


def test_delayed_checks_of_several_micro_batches_add_up():
    model, opt = setup()
    scaler = _amp_state.loss_scalers[0]
    x, _ = DATA[0]
    for k in range(3):  # only the first micro-batch overflows
        with amp.scale_loss(model(x).float().mean(), opt, delay_overflow_check=True) as scaled:
            scaled.backward()
            if k == 0:
                inject(model, math.inf)
    assert scaler.update_scale() is True and amp.loss_scale() == 2.0**15
    assert int(scaler._overflow_buf) == 0  # cleared for the next accumulation
