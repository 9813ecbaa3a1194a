"""What users do to a model and optimizer after ``amp.initialize``: add a param group
(progressive unfreezing), deepcopy the model (EMA, best-model snapshot), tie weights,
initialize other models (a teacher). The fp32 masters and the loss scalers must
follow (Note [Master registry])."""

import copy
import gc
import weakref

import pytest
import torch
from torch import nn

from amp_cases import HALVES
from conftest import dtype_id
from core_ops import amp

SCALE = 2.0**16  # the dynamic scaler's first scale


def two_layers(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))


def backward(model, opt, x, factor=1e-3):
    with amp.scale_loss(model(x).mean() * factor, opt) as scaled:
        scaled.backward()


@pytest.mark.parametrize("level", ["O1", "O2"])
@pytest.mark.parametrize("half", HALVES, ids=dtype_id)
def test_param_group_added_after_initialize(level, half):
    model = two_layers()
    late_fp32 = model[1].bias.detach().clone()
    opt = torch.optim.SGD(model[0].parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level=level, half_dtype=half, verbosity=0)
    opt.add_param_group({"params": list(model[1].parameters()), "lr": 0.1})
    x = torch.randn(1, 4)
    backward(model, opt, x)
    bias = opt.param_groups[1]["params"][1]
    # d(mean(out) * 1e-3)/d(bias) = 1e-3, unscaled (it was 65.5 = 1e-3 * 2^16 before).
    assert bias.dtype == torch.float32 and bias.grad.dtype == torch.float32
    torch.testing.assert_close(bias.grad, torch.tensor([1e-3]), rtol=1e-3, atol=0)
    opt.step()
    torch.testing.assert_close(bias.detach(), late_fp32 - 1e-4, rtol=0, atol=1e-7)
    if level == "O2":  # a master, which the model's state_dict reports and zero_grad clears
        assert bias is not model[1].bias and model[1].bias.dtype == half
        assert torch.equal(model.state_dict()["1.bias"], bias)
        backward(model, opt, x)
        model.zero_grad()
        assert bias.grad is None
    # torch's own check at O1; at O2 the group holds the master, so amp checks.
    with pytest.raises(ValueError, match="more than one parameter group|already in another param"):
        opt.add_param_group({"params": [model[1].bias]})
    assert len(opt.param_groups) == 2


def test_late_group_of_a_new_half_param_gets_a_master():
    model = two_layers()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    extra = nn.Parameter(torch.tensor([0.1, 0.2], dtype=torch.float16))
    opt.add_param_group({"params": [extra]})
    master = opt.param_groups[1]["params"][0]
    assert master.dtype == torch.float32 and torch.equal(master, extra.float())
    grad = torch.tensor([2.0**-10, -(2.0**-9)])  # exact in fp16 times the scale, and back
    with amp.scale_loss((extra.float() * grad).sum(), opt) as scaled:
        scaled.backward()
    assert extra.grad is None and torch.equal(master.grad, grad)
    opt.step()
    expected = torch.tensor([0.1, 0.2], dtype=torch.float16).float() - 0.5 * grad
    assert torch.equal(master.detach(), expected)
    assert torch.equal(extra, expected.half())


def test_deepcopy_of_an_o2_model_is_independent():
    torch.manual_seed(0)
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    master = next(iter(amp.master_params(opt)))
    snap = copy.deepcopy(model)
    snap_weight = snap.weight.detach().clone()
    backward(model, opt, torch.randn(4, 2), factor=1e-2)
    opt.step()
    # The snapshot's state_dict is its own (half) weights, not the trained masters.
    assert torch.equal(snap.state_dict()["weight"], snap_weight.float())
    assert not torch.equal(snap.state_dict()["weight"], model.state_dict()["weight"])
    # Loading into the snapshot changes the snapshot only.
    before = master.detach().clone()
    snap.load_state_dict({"weight": torch.full((2, 2), 0.5), "bias": torch.zeros(2)})
    assert torch.equal(master, before) and torch.equal(snap.weight, torch.full((2, 2), 0.5).half())
    # Its zero_grad leaves the original's master grads alone.
    backward(model, opt, torch.randn(4, 2))
    grad = master.grad.clone()
    snap.zero_grad()
    assert torch.equal(master.grad, grad)
    model.zero_grad()
    assert master.grad is None


def test_o2_state_dict_of_tied_weights():
    class TiedLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(5, 3)
            self.out = nn.Linear(3, 5, bias=False)
            self.out.weight = self.emb.weight

        def forward(self, i):
            return self.out(self.emb(i))

    torch.manual_seed(0)
    model = TiedLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    (master,) = amp.master_params(opt)
    sd = model.state_dict()
    # Both names hold the master (before, the alias held the fp16 rounding: 9e-4 off).
    assert torch.equal(sd["emb.weight"], master) and torch.equal(sd["out.weight"], master)
    plain = TiedLM()
    plain.load_state_dict(sd)
    assert torch.equal(plain.emb.weight, master)
    # Loading either key fills the one master.
    model.load_state_dict({"emb.weight": torch.ones(5, 3), "out.weight": torch.ones(5, 3)})
    assert torch.equal(master, torch.ones(5, 3))


def test_second_initialize_keeps_the_first_calls_state():
    student = nn.Linear(3, 3)
    opt = torch.optim.SGD(student.parameters(), lr=0.1)
    student, opt = amp.initialize(student, opt, opt_level="O2", num_losses=2, verbosity=0)
    teacher = amp.initialize(nn.Linear(3, 3), opt_level="O3", verbosity=0)
    assert teacher.weight.dtype == torch.float16
    x = torch.randn(4, 3)
    (master, _) = amp.master_params(opt)
    before = master.detach().clone()
    with amp.scale_loss((student(x) - teacher(x)).pow(2).mean(), opt) as scaled:
        scaled.backward()
    assert master.grad is not None and master.grad.abs().sum() > 0
    opt.step()
    torch.testing.assert_close(master.detach(), before - 0.1 * master.grad, rtol=0, atol=1e-7)
    # The student's second loss scaler survived; the models-only call left
    # amp.state_dict() describing the training call.
    with amp.scale_loss(student(x).sum() * 1e-3, opt, loss_id=1) as scaled:
        scaled.backward()
    assert list(amp.state_dict()) == ["loss_scaler0", "loss_scaler1"]
    # A second training call (a GAN's other half) keeps its own scalers too.
    disc = nn.Linear(3, 1)
    disc_opt = torch.optim.SGD(disc.parameters(), lr=0.1)
    disc, disc_opt = amp.initialize(disc, disc_opt, opt_level="O1", loss_scale=128.0, verbosity=0)
    loss = student(x).sum().detach().requires_grad_()
    with amp.scale_loss(loss, opt, loss_id=1) as scaled:
        assert float(scaled.detach() / loss.detach()) == SCALE
    loss = disc(x).sum().detach().requires_grad_()
    with amp.scale_loss(loss, disc_opt) as scaled:
        assert float(scaled.detach() / loss.detach()) == 128.0
    with pytest.raises(ValueError, match="optimizers from different amp.initialize calls"):
        with amp.scale_loss(disc(x).sum(), [opt, disc_opt]):
            pass


def test_amp_state_does_not_keep_a_finished_run_alive():
    """A sweep initializes fresh models again and again: the amp state the last call
    left (for amp.state_dict) holds no model or optimizer of its own."""
    model = nn.Linear(3, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    refs = [weakref.ref(model), weakref.ref(opt)]
    del model, opt
    gc.collect()
    assert [r() for r in refs] == [None, None]
    assert list(amp.state_dict()) == ["loss_scaler0"]  # the scalers themselves stay


@pytest.mark.parametrize("how", ["submodule_load", "param_copy"])
def test_o2_weights_written_after_initialize_are_trained(how):
    # Apex's order is initialize, then load. A load into a submodule (not the root) or
    # a write into a param reached the half params only, and the first step put the
    # masters' old values back. Now a submodule load sets the masters exactly and a
    # param write is taken up at the first scale_loss (rounded, as Apex's lazily made
    # masters were).
    torch.manual_seed(0)
    pretrained = nn.Linear(4, 4).state_dict()
    model = two_layers(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    if how == "submodule_load":
        model[0].load_state_dict(pretrained)
        want = pretrained["weight"]  # exact float32
    else:
        with torch.no_grad():
            model[0].weight.copy_(pretrained["weight"])
        want = pretrained["weight"].half().float()
    if how == "submodule_load":
        assert torch.equal(model[0].state_dict()["weight"], want)  # a submodule's state dict too
    backward(model, opt, torch.randn(3, 4))  # a direct write is taken up here
    opt.step()
    assert torch.equal(model[0].weight, want.half())
    assert torch.equal(model.state_dict()["0.weight"], want)
    assert torch.equal(amp.master_params(opt).__next__(), want)


def test_o2_state_dict_changes_nothing():
    # EMA libraries swap their weights into the model, save, and swap back: state_dict
    # must not take the swapped-in half weights into the masters.
    model = two_layers(2)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    backward(model, opt, torch.randn(3, 4))
    opt.step()
    masters = [m.detach().clone() for m in amp.master_params(opt)]
    training = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)  # the EMA weights
    saved = model.state_dict()  # what the model holds: the EMA weights (Note [Writes to O2 half params])
    assert all(torch.equal(saved[k], p.float()) for k, p in model.named_parameters())
    with torch.no_grad():
        for p, t in zip(model.parameters(), training):
            p.copy_(t)
    backward(model, opt, torch.randn(3, 4))
    opt.step()
    assert all(torch.equal(a, b) for a, b in zip(amp.master_params(opt), masters))


def test_o2_module_attached_after_initialize_saves_and_loads_its_masters():
    model = two_layers(3)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    model.extra = nn.Linear(4, 4).half()  # attached later, its params added to the optimizer
    opt.add_param_group({"params": list(model.extra.parameters())})
    master = amp.master_params(opt)
    master = [m for m in master if m.shape == (4, 4)][-1]
    assert torch.equal(model.state_dict()["extra.weight"], master)
    loaded = torch.randn(4, 4)
    model.load_state_dict({**model.state_dict(), "extra.weight": loaded})
    assert torch.equal(master, loaded)


def test_o1_outputs_with_a_to_method_are_left_alone():
    class Out:
        def __init__(self, x):
            self.x = x

        def to(self, *args):
            raise AssertionError("O1 must not cast outputs of other types than tensors")

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            return Out(self.lin(x))

    model = amp.initialize(Net(), opt_level="O1", half_dtype=torch.bfloat16, verbosity=0)
    assert isinstance(model(torch.ones(1, 2)), Out)


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_a_step_between_forward_and_backward_is_caught_by_autograd(level):
    """The step (O1) and the copy of the masters into the half weights (O2) write
    behind autograd's back; the version counters move on, so a backward through the
    weights as they were fails as with torch instead of giving wrong grads."""
    model = two_layers()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level=level, half_dtype=torch.bfloat16, verbosity=0)
    backward(model, opt, torch.ones(2, 4))
    saved = sum((p * p).sum() for p in model.parameters())
    opt.step()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved.backward()


def test_o2_writes_between_steps_reach_the_masters_element_by_element():
    """A clamp of the half weights under no_grad between two steps (weight clipping, an
    SWA or EMA callback writing weights in) is trained from; the elements it did not
    change keep their masters' extra bits. Before, only writes before the first step
    were seen."""
    model = two_layers(4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    for _ in range(2):
        backward(model, opt, torch.randn(3, 4))
        opt.step()
        opt.zero_grad()
    master = next(amp.master_params(opt))
    before = master.detach().clone()
    with torch.no_grad():
        model[0].weight.clamp_(-0.1, 0.1)
    clamped = model[0].weight.detach().clone()
    assert torch.equal(model.state_dict()["0.weight"], torch.where(before.half() == clamped, before, clamped.float()))
    opt.zero_grad()
    backward(model, opt, torch.zeros(3, 4))  # a zero input: the grads of layer 0's weight are 0
    opt.step()
    written = before.half() != clamped
    assert written.any() and (~written).any()
    assert torch.equal(master[written], clamped.float()[written])
    assert torch.equal(master[~written], before[~written])
