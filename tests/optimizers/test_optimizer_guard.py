"""FusedOptimizer(skip_nonfinite=True): the guard for the fused optimizers used without
amp (Lightning's ``bf16-true``, a plain loop), for every optimizer of the registry
(optimizer_registry.py, generic test "skip_nonfinite") in each of its variants, on each
device. A step whose grads hold an inf or nan changes nothing (params, state, step
counts) and is counted in ``skipped_steps``; the next step is the step the skipped one
would have been. The flag is decided on the device (one read-only pass), so a compiled
step still traces as one graph."""

import pytest
import torch
from optim_cases import DEVICES
from optimizer_registry import cases

GUARDED = cases("skip_nonfinite", variants=True)


def params(config, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g).to(device, config.dtype).requires_grad_() for n in (300, 40)]


def set_grads(ps, k, poison=False):
    g = torch.Generator().manual_seed(100 + k)
    for i, p in enumerate(ps):
        p.grad = torch.randn(p.shape, generator=g).to(p.device, p.dtype)
        if poison and i == 1:
            p.grad[7] = float("nan")


def state_of(opt):
    return [v.clone() for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]


@pytest.mark.parametrize("info,config", GUARDED)
@pytest.mark.parametrize("device", DEVICES)
def test_a_non_finite_step_changes_nothing_and_the_run_goes_on_as_if_it_never_came(device, info, config):
    guarded_ps, clean_ps = params(config, device), params(config, device)
    guarded, clean = info.make(guarded_ps, config, skip_nonfinite=True), info.make(clean_ps, config)
    for k in range(2):
        set_grads(guarded_ps, k), set_grads(clean_ps, k)
        guarded.step(), clean.step()
    before = [p.detach().clone() for p in guarded_ps], state_of(guarded)
    set_grads(guarded_ps, 99, poison=True)
    guarded.step()
    assert all(torch.equal(a, b) for a, b in zip(before[0], guarded_ps))
    assert all(torch.equal(a, b) for a, b in zip(before[1], state_of(guarded)))
    assert guarded.skipped_steps == 1
    for k in range(2, 4):
        set_grads(guarded_ps, k), set_grads(clean_ps, k)
        guarded.step(), clean.step()
    for p, q in zip(guarded_ps, clean_ps):
        assert torch.equal(p, q)
    assert guarded.skipped_steps == 1


@pytest.mark.parametrize("info", cases("skip_nonfinite"))
@pytest.mark.parametrize("device", DEVICES)
def test_off_by_default_the_nan_reaches_the_weights(device, info):
    # every_path: without clipping, whose non-finite norm would skip the step (LAMB's default).
    ps = params(info.every_path, device)
    opt = info.make(ps, info.every_path)
    set_grads(ps, 0, poison=True)
    opt.step()
    assert not torch.isfinite(ps[1]).all() and opt.skipped_steps == 0


@pytest.mark.parametrize("info", cases("skip_nonfinite"))
@pytest.mark.parametrize("device", DEVICES)
def test_a_first_step_skipped_makes_no_state_that_reads_as_a_step_taken(device, info):
    ps, fresh_ps = params(info.typical, device), params(info.typical, device)
    opt, fresh = info.make(ps, skip_nonfinite=True), info.make(fresh_ps)
    set_grads(ps, 0, poison=True)
    opt.step()
    set_grads(ps, 1), set_grads(fresh_ps, 1)
    opt.step(), fresh.step()
    for p, q in zip(ps, fresh_ps):
        assert torch.equal(p, q)


@pytest.mark.parametrize("info", cases("skip_nonfinite"))
@pytest.mark.parametrize("device", DEVICES)
def test_the_guarded_step_compiles_as_one_graph_and_skips_as_eager(device, info):
    torch._dynamo.reset()
    ps, eager_ps = params(info.typical, device), params(info.typical, device)
    opt, eager = info.make(ps, skip_nonfinite=True), info.make(eager_ps, skip_nonfinite=True)
    set_grads(ps, 0), set_grads(eager_ps, 0)
    opt.step(), eager.step()  # state made outside the graph
    step = torch.compile(opt.step, backend="aot_eager", fullgraph=True)
    for k, poison in ((1, False), (2, True), (3, False)):
        set_grads(ps, k, poison), set_grads(eager_ps, k, poison)
        step(), eager.step()
    for p, q in zip(ps, eager_ps):
        assert torch.equal(p, q)
    assert opt.skipped_steps == eager.skipped_steps == 1


@pytest.mark.parametrize("info", cases("skip_nonfinite"))
def test_skip_nonfinite_takes_a_switch(info):
    """The setting's one parser (core_ops.settings): a bool, 0 / 1, or a switch's text."""
    with pytest.raises(ValueError, match="skip_nonfinite='maybe': expected one of 1, true, yes, on, 0"):
        info.make(params(info.typical, "cpu"), skip_nonfinite="maybe")
    assert info.make(params(info.typical, "cpu"), skip_nonfinite=1).skip_nonfinite is True
