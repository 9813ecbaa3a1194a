"""AmpLoop: amp for a loop a framework owns (the engine of the Lightning and Accelerate
plugins). Checked against amp.initialize + scale_loss on the same model and data
(bit for bit: the same kernels in the same order), and for what the protocol adds:
optimizers attached after the backward, unscaling once per step, clipping by the true
norm, skipped steps, its state dict."""

import copy

import pytest
import torch
import torch.nn.functional as F

from amp_cases import HALVES, batches, conv_net
from conftest import dtype_id
from core_ops import amp
from core_ops.amp import AmpLoop
from core_ops.optimizers import FusedAdam

DATA = batches(6)
OPTIMIZERS = {"sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
              "fused_adam": lambda ps: FusedAdam(ps, lr=3e-3)}


def apex_run(level, half, make_opt, data=DATA):
    model = conv_net()
    model, opt = amp.initialize(model, make_opt(model.parameters()), opt_level=level,
                                half_dtype=half, verbosity=0)
    for x, y in data:
        opt.zero_grad()
        with amp.scale_loss(F.cross_entropy(model(x), y), opt) as scaled:
            scaled.backward()
        opt.step()
    return model, opt


def loop_run(level, half, make_opt, data=DATA, attach_late=False, unscale_each_backward=True):
    loop = AmpLoop(level, half_dtype=half)
    model = loop.prepare_model(conv_net())
    opt = make_opt(model.parameters())
    if not attach_late:
        loop.attach(opt)
    for x, y in data:
        opt.zero_grad()
        with loop.autocast("cpu"):
            loss = F.cross_entropy(model(x), y)
        loop.scale(loss).backward()
        if unscale_each_backward:
            loop.unscale_(opt)
        loop.step(opt)
        loop.update()
    return model, opt, loop


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("half", HALVES, ids=dtype_id)
@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
def test_the_loop_trains_as_initialize_and_scale_loss(level, half, opt_name):
    ours, ours_opt, loop = loop_run(level, half, OPTIMIZERS[opt_name])
    theirs, theirs_opt = apex_run(level, half, OPTIMIZERS[opt_name])
    for p, q in zip(ours.parameters(), theirs.parameters()):
        assert p.dtype == q.dtype and torch.equal(p, q)
    for m, n in zip(amp.master_params(ours_opt), amp.master_params(theirs_opt)):
        assert torch.equal(m, n)
    assert loop.loss_scale == amp.loss_scale() == (2.0**16 if level != "O3" else 1.0)


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_an_optimizer_attached_after_the_backward_trains_the_same(level):
    """Fabric's order: the plugin meets the optimizer at its first step."""
    a, _, _ = loop_run(level, torch.float16, OPTIMIZERS["sgd"])
    b, _, _ = loop_run(level, torch.float16, OPTIMIZERS["sgd"], attach_late=True)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)


def test_grads_accumulate_scaled_until_one_unscale_before_the_step():
    """Inside DDP's no_sync the backward passes must not reach the masters: unscaling
    once before the step sums the micro-batches' grads (scaled, in fp16) first. The
    sum equals per-backward unscaling into the fp32 masters up to fp16 rounding."""
    results = []
    for each in (True, False):
        loop = AmpLoop("O2", half_dtype=torch.float16)
        model = loop.prepare_model(conv_net())
        opt = loop.attach(torch.optim.SGD(model.parameters(), lr=0.05))
        for x, y in DATA[:3]:  # three micro-batches, one step
            loop.scale(F.cross_entropy(model(x), y) / 3).backward()
            if each:
                loop.unscale_(opt)
        loop.unscale_(opt)
        results.append([m.grad.clone() for m in amp.master_params(opt)])
        loop.step(opt)
        loop.update()
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=2e-3, atol=1e-5)  # fp16 sums: a few fp16 ulps


def test_an_overflow_skips_the_step_and_backs_the_scale_off():
    loop = AmpLoop("O2", half_dtype=torch.float16)
    model = loop.prepare_model(conv_net())
    opt = loop.attach(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    x, y = DATA[0]
    for step in range(3):
        opt.zero_grad()
        loop.scale(F.cross_entropy(model(x), y)).backward()
        if step == 1:
            model[0].weight.grad[0, 0, 0, 0] = float("inf")
            before = ([p.detach().clone() for p in model.parameters()],
                      copy.deepcopy(opt.state_dict()))
        loop.step(opt)
        loop.update()
        assert loop.step_was_skipped(opt) == (step == 1)
        if step == 1:
            assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before[0]))
            assert str(opt.state_dict()) == str(before[1])
    assert loop.loss_scale == 2.0**15 and loop.skipped_steps == 1


def test_clipping_sees_the_unscaled_master_grads_and_returns_the_true_norm():
    loop = AmpLoop("O2", half_dtype=torch.bfloat16)
    model = loop.prepare_model(conv_net())
    opt = loop.attach(torch.optim.SGD(model.parameters(), lr=0.05))
    x, y = DATA[0]
    loop.scale(F.cross_entropy(model(x), y)).backward()
    loop.unscale_(opt)
    grads = [p.grad.clone() for p in amp.master_params(opt)]
    true_norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
    norm = loop.clip_grad_norm_(opt, 0.1)
    torch.testing.assert_close(norm, true_norm, rtol=1e-5, atol=0)
    assert norm > 0.1  # it clipped
    for p, g in zip(amp.master_params(opt), grads):
        torch.testing.assert_close(p.grad, g * (0.1 / (true_norm + 1e-6)), rtol=1e-5, atol=1e-9)
    loop.step(opt)
    assert not loop.step_was_skipped(opt)


def test_the_state_dict_round_trips_and_names_its_level():
    _, _, loop = loop_run("O2", torch.float16, OPTIMIZERS["sgd"], data=DATA[:2])
    loop.scaler.update(2.0**10)
    state = loop.state_dict()
    fresh = AmpLoop("O2", half_dtype=torch.float16)
    fresh.load_state_dict(state)
    assert fresh.loss_scale == 2.0**10 and fresh.state_dict() == state
    o1 = AmpLoop("O1")  # a resume at another level: the dynamic scaler carries over, with a warning
    with pytest.warns(UserWarning, match="the amp state of an O2 run into O1: its loss scaler carries over"):
        o1.load_state_dict(state)
    assert o1.loss_scale == 2.0**10
    o0 = AmpLoop("O0")
    with pytest.warns(UserWarning, match="does not apply here and is left out"):
        o0.load_state_dict(state)
    assert o0.loss_scale == 1.0 and not o0.scaler.dynamic


def test_bad_options_and_foreign_optimizers_are_refused():
    with pytest.raises(TypeError, match="AmpLoop got unknown option loss_scal \\(did you mean loss_scale\\?\\); "
                                        "the options are opt_level, half_dtype, loss_scale, .*, cast_model_type"):
        AmpLoop("O2", loss_scal=128)
    with pytest.raises(ValueError, match="opt_level='O7': expected one of O0, O1, O2, O3"):
        AmpLoop("O7")
    model = conv_net()
    model, opt = amp.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), opt_level="O2",
                                verbosity=0)
    with pytest.raises(RuntimeError, match="already belongs to another amp.initialize or AmpLoop"):
        AmpLoop("O2").attach(opt)


class Gan(torch.nn.Module):
    """A generator and a discriminator called one by one, as a training step does."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.G = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 6))
        self.D = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))

    def forward(self, z):
        return self.D(self.G(z))


@pytest.mark.parametrize("half", HALVES, ids=dtype_id)
def test_half_layers_take_float32_inputs_from_anywhere_and_targets_stay(half):
    """At O2 each module holding half params casts what reaches it: noise made in a
    training step, a submodule called directly, another call's float32 output. Nothing
    else is cast (a float target keeps its precision)."""
    loop = AmpLoop("O2", half_dtype=half)
    gan = loop.prepare_model(Gan())
    opt = loop.attach(torch.optim.SGD(gan.parameters(), lr=0.1))
    z = torch.randn(16, 4)
    fake = gan.G(z)  # a submodule, float32 noise
    assert fake.dtype == half
    assert gan(z).dtype == torch.float32  # the prepared model's outputs: float32
    score = gan.D(gan.G(z).float())  # float32 into a half submodule
    target = torch.full((16, 1), 1e5)  # a float target beyond fp16's range stays float32
    loss = F.mse_loss(score.float() / 1e5, target / 1e5)
    loop.scale(loss).backward()
    loop.step(opt)
    loop.update()
    assert not loop.step_was_skipped(opt) and target.dtype == torch.float32
    assert gan.D[1].weight.dtype == torch.float32  # BatchNorm kept float32, fed half


def test_a_model_prepared_by_another_loop_is_taken_with_its_masters():
    """A second Trainer (fit, then test) has its own AmpLoop."""
    first = AmpLoop("O2")
    model = first.prepare_model(conv_net())
    opt = first.attach(torch.optim.SGD(model.parameters(), lr=0.1))
    second = AmpLoop("O2")
    assert second.prepare_model(model) is model
    again = second.attach(torch.optim.SGD(model.parameters(), lr=0.1))
    masters = [p for g in again.param_groups for p in g["params"]]
    assert masters[0] is opt.param_groups[0]["params"][0]  # the same fp32 master
    with pytest.raises(RuntimeError, match="prepared for amp at O2 with torch.float16 .* cannot be cast again for "
                                           "O1"):
        AmpLoop("O1").prepare_model(model)


def test_a_followed_scheduler_does_not_advance_after_a_skipped_step():
    loop = AmpLoop("O2", half_dtype=torch.float16)
    model = loop.prepare_model(conv_net())
    opt = loop.attach(torch.optim.SGD(model.parameters(), lr=0.1))
    sched = loop.follow_skips(torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5))
    plain = torch.optim.lr_scheduler.StepLR(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1), 1, 0.5)
    assert isinstance(sched, torch.optim.lr_scheduler.StepLR) and sched.state_dict().keys() == plain.state_dict().keys()
    x, y = DATA[0]
    lrs = []
    for step in range(3):
        opt.zero_grad()
        loop.scale(F.cross_entropy(model(x), y)).backward()
        if step == 1:
            model[0].weight.grad[0, 0, 0, 0] = float("nan")
        loop.step(opt)
        loop.update()
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs == [0.05, 0.05, 0.025]  # the skipped step 1 left the schedule where it was
    assert torch.load(_saved(sched), weights_only=False).__class__ is torch.optim.lr_scheduler.StepLR


def _saved(obj):
    import io
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


def test_core_ops_clip_grad_norm_matches_torch():
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(n, generator=g) for n in (3, 1000, 17)] + [torch.randn(5, generator=g).double()]
    params = [torch.zeros_like(t, requires_grad=True) for t in grads]
    for p, t in zip(params, grads):
        p.grad = t.clone()
    want = torch.nn.utils.clip_grad_norm_(params, 0.5)
    from core_ops import clip_grad_norm_
    got = clip_grad_norm_(grads, 0.5)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want.double(), rtol=1e-6, atol=0)
    for p, t in zip(params, grads):
        torch.testing.assert_close(t, p.grad, rtol=1e-6, atol=1e-9)
    with pytest.raises(ValueError, match="max_norm must be > 0"):
        clip_grad_norm_(grads, 0.0)
