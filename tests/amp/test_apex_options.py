"""Apex options and idioms its own multi-model tests rely on: ``cast_model_type=False``,
``_amp_state.allow_incoming_model_not_fp32``, zeroing the model's grads by hand at O2,
and O1's ``_amp_state.handle``."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from amp_cases import batches, conv_net
from core_ops import amp

DATA = batches(4)


def sgd_steps(model, opt, scaled, zero=None):
    """Four steps of plain SGD, with amp's scale_loss when ``scaled``; ``zero(model,
    opt)`` zeroes the grads before each (default: opt.zero_grad())."""
    for x, y in DATA:
        (zero or (lambda m, o: o.zero_grad()))(model, opt)
        loss = F.cross_entropy(model(x), y)
        if scaled:
            with amp.scale_loss(loss, opt) as s:
                s.backward()
        else:
            loss.backward()
        opt.step()


@pytest.mark.parametrize("level", ["O0", "O2", "O3"])
def test_cast_model_type_false_leaves_the_model_as_it_is(level):
    """Apex's "do not cast the model": an fp32 model stays fp32 (O2 then makes no
    masters: none of its params is half) and trains as plain SGD; the loss scale
    (a power of two) changes nothing."""
    ours, plain = conv_net(), conv_net()
    opt = torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    ours, opt = amp.initialize(ours, opt, opt_level=level, cast_model_type=False, verbosity=0)
    assert amp._amp_state.opt_properties.cast_model_type is None
    assert all(p.dtype == torch.float32 for p in ours.parameters())
    assert [id(p) for p in amp.master_params(opt)] == [id(p) for p in ours.parameters()]
    sgd_steps(ours, opt, scaled=True)
    sgd_steps(plain, torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9), scaled=False)
    for p, q in zip(ours.parameters(), plain.parameters()):
        assert torch.equal(p, q)


def test_cast_model_type_takes_only_a_floating_dtype_or_false():
    with pytest.raises(ValueError, match="cast_model_type must be a floating torch.dtype or False"):
        amp.initialize(conv_net(), opt_level="O2", cast_model_type=torch.int8, verbosity=0)


class HalfHead(nn.Sequential):
    """A float32 layer and a half one (as Apex's add-param-group test has)."""

    def forward(self, x):
        return self[2](torch.tanh(self[0](x)).to(self[2].weight.dtype))


def half_weight_model():
    torch.manual_seed(0)
    model = HalfHead(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    model[2].half()
    return model


def test_incoming_half_params_need_apex_s_flag_and_get_fp32_masters():
    with pytest.raises(TypeError, match="'2.weight' is torch.float16.*allow_incoming_model_not_fp32"):
        amp.initialize(half_weight_model(), opt_level="O2", verbosity=0)
    model = half_weight_model()
    halves = [p.detach().clone() for p in model[2].parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    amp._amp_state.allow_incoming_model_not_fp32 = True
    try:
        model, opt = amp.initialize(model, opt, opt_level="O2", cast_model_type=False, verbosity=0)
    finally:
        amp._amp_state.allow_incoming_model_not_fp32 = False
    assert [p.dtype for p in model.parameters()] == [torch.float32] * 2 + [torch.float16] * 2
    masters = list(amp.master_params(opt))
    assert all(m.dtype == torch.float32 for m in masters)
    assert all(torch.equal(m, h.float()) for m, h in zip(masters[2:], halves))  # from the half values
    assert model.state_dict()["2.weight"].dtype == torch.float32
    x = torch.randn(4, 6)
    with amp.scale_loss(model(x).float().mean(), opt) as s:
        s.backward()
    opt.step()
    assert not torch.equal(masters[2], halves[0].float())
    assert torch.equal(model[2].weight, masters[2].half())  # the half weights follow the masters


def drop_model_grads(model, opt):
    for p in model.parameters():
        p.grad = None


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_o2_grads_zeroed_on_the_model_by_hand_leave_no_stale_master_grads(half):
    """Setting ``p.grad = None`` on the model's half params (Apex's tests do) zeroes the
    grads as ``optimizer.zero_grad()`` does: the masters' grads are spent by each step,
    as Apex cleared them. Before, the next backward added to the old master grads."""
    runs = []
    for zero in (None, drop_model_grads):
        model = conv_net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model, opt = amp.initialize(model, opt, opt_level="O2", half_dtype=half, verbosity=0)
        sgd_steps(model, opt, scaled=True, zero=zero)
        runs.append([m.detach().clone() for m in amp.master_params(opt)])
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_o2_a_param_without_grad_after_a_step_is_not_stepped_again():
    torch.manual_seed(0)
    model = nn.ModuleDict({"used": nn.Linear(4, 4), "spare": nn.Linear(4, 4)})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    x = torch.randn(8, 4)
    spare = [[p.detach().clone() for p in model["spare"].parameters()]]
    for with_spare in (True, False):  # no zero_grad between the steps
        out = model["used"](x.half())
        if with_spare:
            out = out + model["spare"](x.half())
        with amp.scale_loss(out.float().mean(), opt) as s:
            s.backward()
        opt.step()
        spare.append([p.detach().clone() for p in model["spare"].parameters()])
    assert amp._amp_state.loss_scalers[0].loss_scale() == 2.0**16  # no step was skipped
    assert not any(torch.equal(p, q) for p, q in zip(spare[0], spare[1]))
    assert all(torch.equal(p, q) for p, q in zip(spare[1], spare[2]))


class Recorder(nn.Module):
    """Records the dtype its linear layer computes in."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.seen = None

    def forward(self, x):
        y = self.linear(x)
        self.seen = y.dtype
        return y


def test_o1_handle_deactivates_and_pauses_autocast():
    model = Recorder()
    model, opt = amp.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), opt_level="O1",
                                half_dtype=torch.bfloat16, verbosity=0)
    handle = amp._amp_state.handle
    x = torch.randn(2, 4)
    assert handle.is_active() and model(x).dtype == torch.float32 and model.seen == torch.bfloat16
    with handle._disable_casts():
        assert not handle.is_active()
        model(x)
        assert model.seen == torch.float32
    model(x)
    assert model.seen == torch.bfloat16
    handle._deactivate()  # Apex's tests end each O1 case so
    model(x)
    assert not handle.is_active() and model.seen == torch.float32
    copy.deepcopy(model)(x)  # the copy shares the call's handle


def test_other_levels_have_a_handle_that_does_nothing():
    model = Recorder()
    amp.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), opt_level="O2", verbosity=0)
    handle = amp._amp_state.handle
    assert not handle.is_active()
    handle._deactivate()
    with handle._disable_casts():
        pass
    assert model(torch.randn(2, 4)).dtype == torch.float32 and model.seen == torch.float16
