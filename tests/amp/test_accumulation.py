"""Several scale_loss backward passes before one step (Note [Accumulating under amp]
in core_ops/amp/amp_optimizer.py): losses with their own scalers, micro-batches, grads
zeroed in place. Each backward's overflow is counted once, by its own scaler, as in
Apex; the sums are exact for power-of-two scales. (Under DDP: test_amp_ddp.py.)"""

import inspect
import math

import pytest
import torch
from torch import nn

from core_ops import amp


def model_and_opt(level, num_losses=1, batchnorm=False, **kw):
    torch.manual_seed(0)
    layers = [nn.Linear(4, 4)] + ([nn.BatchNorm1d(4)] if batchnorm else []) + [nn.Linear(4, 1)]
    model = nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return amp.initialize(model, opt, opt_level=level, num_losses=num_losses, verbosity=0, **kw)


def backward(model, opt, factor, loss_id=0):
    out = model(0.01 * torch.randn(8, 4)).float()
    with amp.scale_loss(out.sum() * factor, opt, loss_id=loss_id) as scaled:
        scaled.backward()


@pytest.mark.parametrize("level,batchnorm", [("O1", False), ("O2", False), ("O2", True)])
def test_an_overflow_is_counted_once_by_its_own_scaler(level, batchnorm):
    # An earlier backward's inf, rescaled for the next one, is not that one's overflow.
    model, opt = model_and_opt(level, num_losses=2, batchnorm=batchnorm)
    backward(model, opt, math.inf, loss_id=0)
    backward(model, opt, 1e-3, loss_id=1)
    opt.step()
    assert (amp.loss_scale(0), amp.skipped_steps(0)) == (2.0**15, 1)
    assert (amp.loss_scale(1), amp.skipped_steps(1)) == (2.0**16, 0)

    model, opt = model_and_opt(level, batchnorm=batchnorm)
    for k in range(4):
        backward(model, opt, math.inf if k == 0 else 1e-3)
    before = [p.detach().clone() for p in model.parameters()]
    opt.step()  # skipped: the first micro-batch overflowed
    assert (amp.loss_scale(), amp.skipped_steps()) == (2.0**15, 1)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_o3_half_grads_accumulate_without_spurious_overflows():
    # O3 keeps half params without masters; their accumulated grads are set aside,
    # not rescaled: each micro-batch's grads (~0.2, times 2^16) fit float16, their sum
    # rescaled (~0.8 times 2^16) would not.
    torch.manual_seed(0)
    model = nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, opt = amp.initialize(model, opt, opt_level="O3", loss_scale="dynamic", verbosity=0)
    for _ in range(3):
        for _ in range(4):
            x = (0.4 + 0.01 * torch.randn(8, 16)).half()
            with amp.scale_loss(model(x).float().mean() * 0.5, opt) as scaled:
                scaled.backward()
        opt.step()
        opt.zero_grad()
    assert (amp.loss_scale(), amp.skipped_steps()) == (2.0**16, 0)


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_accumulated_grads_are_the_sum_of_the_backwards(level):
    model, opt = model_and_opt(level, batchnorm=True)
    torch.manual_seed(1)
    backward(model, opt, 1e-3)
    first = [g.clone() for g in (p.grad for p in amp.master_params(opt))]
    opt.zero_grad()
    torch.manual_seed(2)
    backward(model, opt, 1e-3)
    second = [g.clone() for g in (p.grad for p in amp.master_params(opt))]
    opt.zero_grad()
    torch.manual_seed(1)
    backward(model, opt, 1e-3)
    torch.manual_seed(2)
    backward(model, opt, 1e-3)
    for p, a, b in zip(amp.master_params(opt), first, second):
        assert torch.equal(p.grad, a + b)  # power-of-two scale: the rescale is exact


def test_o2_master_grads_keep_their_memory_across_accumulations():
    model, opt = model_and_opt("O2")
    addresses = set()
    for _ in range(3):
        opt.zero_grad(set_to_none=False)
        backward(model, opt, 1e-3)
        backward(model, opt, 1e-3)
        addresses.add(next(amp.master_params(opt)).grad.data_ptr())
    assert len(addresses) == 1  # static addresses, e.g. for captured steps


def test_zero_grad_keeps_the_optimizer_s_signature():
    """Accelerate passes ``set_to_none`` only where inspect.signature shows it (and
    refuses otherwise), so the zero_grad that also clears the model's grads keeps it."""
    _, opt = model_and_opt("O2")
    assert "set_to_none" in inspect.signature(opt.zero_grad).parameters
