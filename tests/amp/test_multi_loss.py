"""Several losses with their own scalers, several models and optimizers, and gradient
accumulation with delay_unscale: the fp32 master grads equal the half grads of each
scaled loss divided by its own scale, exactly."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from amp_cases import HALVES, batches, conv_net, inject
from conftest import dtype_id
from core_ops import amp
from core_ops.optimizers import FusedAdam

DATA = batches(3)


def half_grads(model, loss_fns_and_scales, half):
    """What the grads should be: a half copy of ``model``, each loss scaled,
    backward, its half grads upcast and divided by its scale, summed in order."""
    total = None
    for fn, scale in loss_fns_and_scales:
        m = copy.deepcopy(model)
        m.zero_grad()
        (fn(m) * scale).backward()
        g = [p.grad.float() / scale for p in m.parameters()]
        total = g if total is None else [a + b for a, b in zip(total, g)]
    return total


def reference_half_model(seed, half):
    model = conv_net(seed)
    for module in model.modules():
        if not isinstance(module, torch.nn.BatchNorm2d):
            for p in module.parameters(recurse=False):
                p.data = p.data.to(half)
    return model


@pytest.mark.parametrize("half", HALVES, ids=dtype_id)
def test_two_losses_with_their_own_scales(half):
    model = conv_net()
    opt = FusedAdam(model.parameters(), lr=1e-3)
    model, opt = amp.initialize(model, opt, opt_level="O2", half_dtype=half, num_losses=2, verbosity=0)
    (x, y), (x2, _) = DATA[0], DATA[1]
    # An overflow on loss 1 halves its scale only.
    with amp.scale_loss(model(x2).pow(2).mean(), opt, loss_id=1) as scaled:
        scaled.backward()
        inject(model, math.inf)
    opt.step()
    opt.zero_grad()
    assert [amp.state_dict()[f"loss_scaler{i}"]["loss_scale"] for i in (0, 1)] == [2.0**16, 2.0**15]

    ref = reference_half_model(0, half)
    loss_a = lambda m: F.cross_entropy(m(x.to(half)).float(), y)  # noqa: E731
    loss_b = lambda m: m(x2.to(half)).float().pow(2).mean()  # noqa: E731
    expected = half_grads(ref, [(loss_a, 2.0**16), (loss_b, 2.0**15)], half)
    with amp.scale_loss(loss_a(model), opt, loss_id=0) as scaled:
        scaled.backward()
    with amp.scale_loss(loss_b(model), opt, loss_id=1) as scaled:
        scaled.backward()
    for got, want in zip(amp.master_params(opt), expected):
        assert torch.equal(got.grad, want)


@pytest.mark.parametrize("half", HALVES, ids=dtype_id)
def test_delay_unscale_accumulates_scaled_half_grads(half):
    model = conv_net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O2", half_dtype=half, verbosity=0)
    (x1, y1), (x2, y2) = DATA[0], DATA[1]
    ref = reference_half_model(0, half)
    ref.zero_grad()
    for x, y in ((x1, y1), (x2, y2)):  # accumulate in half, unscale once
        (F.cross_entropy(ref(x.to(half)).float(), y) * 2.0**16).backward()
    expected = [p.grad.float() / 2.0**16 for p in ref.parameters()]
    with amp.scale_loss(F.cross_entropy(model(x1), y1), opt, delay_unscale=True) as scaled:
        scaled.backward()
    assert model[0].weight.grad is not None  # still scaled, in the model
    with amp.scale_loss(F.cross_entropy(model(x2), y2), opt) as scaled:
        scaled.backward()
    assert model[0].weight.grad is None
    for got, want in zip(amp.master_params(opt), expected):
        assert torch.equal(got.grad, want)


def test_o1_accumulates_unscaled_grads_across_calls():
    model = conv_net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    reference = copy.deepcopy(model)
    model, opt = amp.initialize(model, opt, opt_level="O1", half_dtype=torch.bfloat16, verbosity=0)
    for x, y in DATA[:2]:
        with amp.scale_loss(F.cross_entropy(model(x), y), opt) as scaled:
            scaled.backward()
    for x, y in DATA[:2]:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = reference(x)
        F.cross_entropy(out.float(), y).backward()
    # Power-of-two scales make unscaling exact; the two runs differ only in that ours
    # backpropagates the scaled loss, which rounds differently in bf16 (2^-8 relative).
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got.grad, want.grad, rtol=2e-2, atol=1e-4)


def test_two_models_two_optimizers():
    gen, disc = conv_net(0), conv_net(1)
    og, od = FusedAdam(gen.parameters(), lr=1e-3), FusedAdam(disc.parameters(), lr=1e-3)
    [gen, disc], [og, od] = amp.initialize([gen, disc], [og, od], opt_level="O2", num_losses=2,
                                           verbosity=0)
    x, y = DATA[0]
    g_before, d_before = gen[0].weight.detach().clone(), disc[0].weight.detach().clone()
    with amp.scale_loss(F.cross_entropy(gen(x), y), og, loss_id=0) as scaled:
        scaled.backward()
        inject(gen, math.nan)
    with amp.scale_loss(F.cross_entropy(disc(x), y), od, loss_id=1) as scaled:
        scaled.backward()
    og.step()
    od.step()
    assert torch.equal(gen[0].weight, g_before)  # overflow in loss 0 skips og only
    assert not torch.equal(disc[0].weight, d_before)
    # disc's half grads went to its masters (batchnorm stays fp32 and keeps its own)
    assert all(p.grad is None for p in disc.parameters() if p.dtype == torch.float16)
    assert all(m.grad is not None for m in amp.master_params(od))
