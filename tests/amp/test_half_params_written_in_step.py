"""Note [Half params written in the step] (amp_optimizer.py): at O2 on the CPU,
FusedAdam writes the model's half params inside its update instead of amp copying the
masters into them after the step. The run is the copying run bit for bit: an fp16
overflow that skips a step, a half param written by hand between steps, a second
param group, clipping of the masters' grads, and a param without a grad included."""

import pytest
import torch

from core_ops import amp
from core_ops.amp.amp_optimizer import AmpOptimizer
from core_ops.multi_tensor_apply import ops as mt_ops
from core_ops.optimizers import FusedAdam


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8),
                               torch.nn.Linear(8, 8))


def _train(half, route, steps=6):
    model = _model()
    frozen_in_step_3 = model[3].weight
    opt = FusedAdam([{"params": list(model[0].parameters()) + list(model[2].parameters())},
                     {"params": list(model[3].parameters()), "lr": 3e-3}], lr=1e-2, weight_decay=0.01)
    model, opt = amp.initialize(model, opt, opt_level="O2", half_dtype=half, verbosity=0)
    if not route:
        opt._core_ops_amp.halves_of = lambda masters: None
    data = torch.Generator().manual_seed(1)
    for step in range(steps):
        x = torch.randn(4, 16, generator=data).to(half)
        loss = model(x).float().square().mean()
        if step == 1 and half == torch.float16:
            loss = loss * 1e30  # overflows fp16's grads: the step is skipped
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        if step == 3:
            frozen_in_step_3.grad = None
            for m in amp.master_params(opt):
                if m.shape == frozen_in_step_3.shape:
                    m.grad = None  # this param sits out a step
        torch.nn.utils.clip_grad_norm_([m for m in amp.master_params(opt) if m.grad is not None], 0.5)
        opt.step()
        opt.zero_grad()
        if step == 2:
            with torch.no_grad():
                model[0].weight[0, :4] = 0.25  # written by hand: the next step starts from it
    state = [t for p in amp.master_params(opt) for t in opt.state[p].values() if isinstance(t, torch.Tensor)]
    return [p.detach().clone() for p in model.parameters()], [m.detach().clone() for m in amp.master_params(opt)], state


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_the_step_writes_the_half_params_as_the_copy_did(half, monkeypatch):
    copies = []
    scale = mt_ops.multi_tensor_scale
    # The copy after the step is the call with the Python float 1.0 (unscaling passes
    # a tensor): count the masters it copies.
    monkeypatch.setattr("core_ops.amp.amp_optimizer.multi_tensor_scale",
                        lambda src, dst, s, *a: (isinstance(s, float) and copies.append(len(src))) or
                        scale(src, dst, s, *a))
    routed = _train(half, route=True)
    routed_copies, copies[:] = list(copies), []
    copied = _train(half, route=False)
    for a_list, b_list in zip(routed, copied):
        assert len(a_list) == len(b_list)
        for a, b in zip(a_list, b_list):
            assert a.dtype == b.dtype and torch.equal(a, b)
    # The copying run copies all 6 masters after each of the 6 steps; the routed one
    # only the weight that sat out step 3 (that step's kernel did not write it).
    assert sum(copies) == 36 and routed_copies == [1]


def test_what_the_step_cannot_write_is_copied():
    """A master whose half param is of another layout is left to the copy (the kernel
    takes masters laid out as their params)."""
    model = torch.nn.Linear(4, 4)
    opt = FusedAdam(model.parameters(), lr=1e-2)
    model, opt = amp.initialize(model, opt, opt_level="O2", half_dtype=torch.bfloat16, verbosity=0)
    handle = opt._core_ops_amp
    assert isinstance(handle, AmpOptimizer)
    masters = list(amp.master_params(opt))
    assert [h is p for h, p in zip(handle.halves_of(masters), model.parameters())] == [True, True]
    assert handle.halves_of([torch.zeros(4, requires_grad=True)]) is None  # no half of its own
    transposed = [masters[0].t()]
    assert handle.halves_of(transposed) is None
