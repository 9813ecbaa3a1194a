"""LossScaler is a drop-in torch.amp.GradScaler: the same scale trajectory and the same
params, step for step, with plain, torch-fused and core_ops-fused optimizers, with
overflows injected; plus Apex's bounds, hysteresis and state dict format."""

import math

import pytest
import torch
from torch import nn

from core_ops.amp import LossScaler
from core_ops.optimizers import FusedAdam, FusedLAMB, FusedNovoGrad

OVERFLOW_AT = {2: math.inf, 5: math.nan, 6: -math.inf}


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    "torch_fused_adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, fused=True),
    "core_ops_fused_adam": lambda ps: FusedAdam(ps, lr=1e-2),
}


def run(scaler, make_opt, steps=10, clip=False, inject=OVERFLOW_AT):
    model = mlp()
    opt = make_opt(model.parameters())
    g = torch.Generator().manual_seed(3)
    scales, params = [], []
    for i in range(steps):
        x, y = torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)
        opt.zero_grad()
        scaler.scale(nn.functional.mse_loss(model(x), y)).backward()
        if i in inject:
            model[0].weight.grad[0, 0] = inject[i]
        if clip:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        params.append([p.detach().clone() for p in model.parameters()])
    return scales, params, opt


@pytest.mark.parametrize("clip", [False, True], ids=["step", "unscale_clip_step"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_matches_torch_grad_scaler(name, clip):
    kwargs = dict(init_scale=2.0**10, growth_interval=2)
    ours = run(LossScaler("cpu", **kwargs), OPTIMIZERS[name], clip=clip)
    theirs = run(torch.amp.GradScaler("cpu", **kwargs), OPTIMIZERS[name], clip=clip)
    assert ours[0] == theirs[0]
    # The scales are powers of two, so unscaling is exact in both: bit-equal params.
    for a, b in zip(ours[1], theirs[1]):
        for x, y in zip(a, b):
            assert torch.equal(x, y)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_large_finite_grads_are_not_overflow(name):
    """A grad of 1e20 is finite, but its square overflows float32: an overflow check by
    norm would skip the step and halve the scale. Ours tests elements, as torch does."""
    kwargs = dict(init_scale=2.0**10, growth_interval=2)
    scaler = LossScaler("cpu", **kwargs)
    ours = run(scaler, OPTIMIZERS[name], inject={3: 1e20})
    theirs = run(torch.amp.GradScaler("cpu", **kwargs), OPTIMIZERS[name], inject={3: 1e20})
    assert scaler.skipped_steps == 0
    assert ours[0] == theirs[0] == [2.0**10 * 2**k for k in (0, 1, 1, 2, 2, 3, 3, 4, 4, 5)]
    for a, b in zip(ours[1], theirs[1]):
        for x, y in zip(a, b):
            assert torch.equal(x, y)


def test_lamb_under_either_scaler():
    """FusedLAMB clips by the global norm inside step(), folding a non-finite norm into
    the scaler's 0-d found_inf (it used to crash: a one-element flag copied into a 0-d
    one). Under LossScaler and torch's GradScaler alike: the same scales and params."""
    kwargs = dict(init_scale=2.0**10, growth_interval=2)
    ours = run(LossScaler("cpu", **kwargs), lambda ps: FusedLAMB(ps, lr=1e-2))
    theirs = run(torch.amp.GradScaler("cpu", **kwargs), lambda ps: FusedLAMB(ps, lr=1e-2))
    assert ours[0] == theirs[0]
    assert [ours[0][i] < ours[0][i - 1] for i in OVERFLOW_AT] == [True] * len(OVERFLOW_AT)
    for a, b in zip(ours[1], theirs[1]):
        for x, y in zip(a, b):
            assert torch.equal(x, y)


def test_novograd_skips_when_a_layer_norm_overflows():
    """NovoGrad takes layer norms of the still-scaled grads; a finite 1e20 makes one
    overflow float32. Under the scaler that step is skipped and the scale halves, and
    the second moments stay finite (an inf there would freeze the layer for good)."""
    scaler = LossScaler("cpu", init_scale=2.0**10, growth_interval=100)
    scales, params, opt = run(scaler, lambda ps: FusedNovoGrad(ps, lr=1e-2), inject={3: 1e20})
    assert scaler.skipped_steps == 1
    assert scales == [2.0**10] * 3 + [2.0**9] * 7
    assert torch.equal(params[2][0], params[3][0])  # the skipped step moved nothing
    assert not torch.equal(params[3][0], params[4][0])
    assert all(torch.isfinite(st["exp_avg_sq"]).all() for st in opt.state.values())


def test_trajectory_and_skip_count():
    scaler = LossScaler(init_scale=2.0**10, growth_interval=2)
    scales, params, _ = run(scaler, OPTIMIZERS["core_ops_fused_adam"])
    # overflow at 2, 5, 6 halves; two clean steps in a row double.
    assert scales == [2.0**10, 2.0**11, 2.0**10, 2.0**10, 2.0**11, 2.0**10, 2.0**9, 2.0**9,
                      2.0**10, 2.0**10]
    assert scaler.skipped_steps == 3
    for i in OVERFLOW_AT:
        for a, b in zip(params[i - 1], params[i]):
            assert torch.equal(a, b)


def test_skipped_step_leaves_fused_state_untouched():
    scaler = LossScaler(init_scale=4.0)
    model = mlp()
    opt = FusedAdam(model.parameters(), lr=1e-2)
    for inject in (False, True):
        opt.zero_grad()
        scaler.scale(model(torch.ones(2, 6)).sum()).backward()
        if inject:
            before = {k: v.clone() for k, v in opt.state[model[0].weight].items()}
            weights = [p.detach().clone() for p in model.parameters()]
            model[2].bias.grad[1] = math.nan
        scaler.step(opt)
        scaler.update()
    for k, v in opt.state[model[0].weight].items():
        assert torch.equal(v, before[k]), k
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))
    assert scaler.get_scale() == 2.0


def test_hysteresis_and_bounds():
    scaler = LossScaler(init_scale=8.0, growth_interval=1, hysteresis=2, min_scale=2.0, max_scale=16.0)
    flags = [0, 1, 1, 1, 1, 0, 0, 0]
    seen = []
    for f in flags:
        scaler.update_from(torch.tensor([float(f)]))
        seen.append(scaler.get_scale())
    # clean: 8->16 (cap); 1st overflow tolerated; 2nd, 3rd, 4th back off to the floor 2.
    assert seen == [16.0, 16.0, 8.0, 4.0, 2.0, 4.0, 8.0, 16.0]
    assert scaler.skipped_steps == 4


def test_static_scaler_skips_without_changing_scale():
    scaler = LossScaler(init_scale=128.0, dynamic=False)
    scaler.update_from(torch.tensor([1.0]))
    scaler.update_from(torch.tensor([0.0]))
    assert scaler.get_scale() == 128.0 and scaler.skipped_steps == 1 and scaler.fixed_scale == 128.0


def test_state_dicts_interoperate():
    ours = LossScaler(init_scale=2.0**10, growth_interval=2)
    run(ours, OPTIMIZERS["sgd_momentum"], steps=4)
    sd = ours.state_dict()
    assert (sd["scale"], sd["_growth_tracker"], sd["skipped_steps"]) == (2.0**10, 1, 1)
    torch_scaler = torch.amp.GradScaler("cpu")
    torch_scaler.load_state_dict(sd)
    assert torch_scaler.get_scale() == 2.0**10 and torch_scaler._get_growth_tracker() == 1
    back = LossScaler()
    back.load_state_dict(torch_scaler.state_dict())
    assert back.get_scale() == 2.0**10 and back.state_dict()["_growth_tracker"] == 1
    apex = LossScaler()
    apex.load_state_dict({"loss_scale": 512.0, "unskipped": 7})
    assert apex.get_scale() == 512.0 and apex.state_dict()["_growth_tracker"] == 7
    assert LossScaler(enabled=False).state_dict() == {}


def test_disabled_is_a_pass_through():
    scaler = LossScaler(enabled=False)
    loss = torch.tensor(3.0)
    assert scaler.scale(loss) is loss and scaler.get_scale() == 1.0
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(1, 6)).sum().backward()
    w = model[0].weight.detach().clone()
    scaler.step(opt)
    assert not torch.equal(w, model[0].weight)


def test_misuse_raises():
    scaler = LossScaler()
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="update\\(\\) found no overflow checks"):
        scaler.update()
    scaler.scale(model(torch.ones(1, 6)).sum()).backward()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called on this optimizer"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(opt)
    with pytest.raises(RuntimeError, match="closures are not supported"):
        scaler.step(opt, lambda: None)
    with pytest.raises(TypeError, match="scale\\(\\) expects a tensor"):
        scaler.scale(3.0)
    with pytest.raises(TypeError, match="scale\\(\\) expects a tensor or a list/tuple of tensors, got dict"):
        scaler.scale({"loss": torch.ones(())})
    with pytest.raises(ValueError, match="growth_factor must be >= 1"):
        LossScaler(growth_factor=0.5)
    with pytest.raises(ValueError, match="init_scale must be a finite number > 0"):
        LossScaler(init_scale=0)


@pytest.mark.parametrize("make_scaler", [lambda: LossScaler(init_scale=2.0**10, growth_interval=2),
                                         lambda: torch.amp.GradScaler("cpu", init_scale=2.0**10,
                                                                      growth_interval=2)],
                         ids=["LossScaler", "torch_GradScaler"])
def test_step_grad_scaler_keyword(make_scaler, recwarn):
    """``opt.step(grad_scaler=s)`` is ``s.step(opt)``: the same params step for step."""
    results = []
    for keyword in (False, True):
        scaler, model = make_scaler(), mlp()
        opt = FusedAdam(model.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(3)
        for i in range(6):
            opt.zero_grad()
            scaler.scale(model(torch.randn(4, 6, generator=g)).pow(2).mean()).backward()
            if i in OVERFLOW_AT:
                model[0].weight.grad[0, 0] = OVERFLOW_AT[i]
            opt.step(grad_scaler=scaler) if keyword else scaler.step(opt)
            scaler.update()
        results.append(([p.detach().clone() for p in model.parameters()], scaler.get_scale()))
    assert results[0][1] == results[1][1] == 2.0**10
    assert all(torch.equal(a, b) for a, b in zip(results[0][0], results[1][0]))
    # torch's GradScaler does not mistake the keyword for its deprecated protocol.
    assert not [w for w in recwarn if "grad_scaler" in str(w.message)]
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['scaler'\\]"):
        opt.step(scaler=scaler)


def test_grad_scaler_call_forms_that_frameworks_use():
    """Accelerate calls ``scaler.step(optimizer, closure)`` with closure None; a
    generator of losses scales as with GradScaler; a scaler between iterations pickles
    (torch.save of a training object holding it)."""
    import pickle
    for scaler in (LossScaler(init_scale=4.0), torch.amp.GradScaler("cpu", init_scale=4.0)):
        model = mlp()
        opt = FusedAdam(model.parameters(), lr=1e-2)
        losses = scaler.scale(model(torch.ones(2, 6)).sum(1) for _ in range(1))
        next(iter(losses)).sum().backward()
        scaler.step(opt, None)
        scaler.update()
        copy = pickle.loads(pickle.dumps(scaler))
        assert copy.get_scale() == scaler.get_scale() == 4.0
    assert [t.item() for t in LossScaler(init_scale=4.0).scale(torch.tensor(float(v)) for v in (1, 2))] == [4.0, 8.0]
    scaler = LossScaler()
    scaler.scale(mlp()(torch.ones(1, 6)).sum())
    scaler.unscale_(torch.optim.SGD(mlp().parameters(), lr=0.1))
    with pytest.raises(RuntimeError, match="pickled only between iterations"):
        pickle.dumps(scaler)
