"""What each rank runs for test_amp_ddp.py: Apex's classic recipe, amp.initialize at
O2 then core_ops' DistributedDataParallel, with an overflow on one rank only."""

import math

import torch
import torch.nn.functional as F

from core_ops import amp
from core_ops.optimizers import FusedAdam, FusedSGD
from core_ops.parallel import DistributedDataParallel
from ddp_workers import data, local, mlp

OVERFLOW_STEP = 2


def o2_with_ddp(rank, world):
    model = mlp(0, width=16)
    opt = FusedAdam(model.parameters(), lr=1e-2)
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    model = DistributedDataParallel(model)
    first = model.module[0].weight
    step = {"i": 0}
    if rank == 1:  # rank 1 alone overflows at OVERFLOW_STEP; the allreduce spreads it
        first.register_hook(lambda g: torch.full_like(g, math.inf)
                            if step["i"] == OVERFLOW_STEP else g)
    history = []
    for i in range(5):
        step["i"] = i
        x, y = data(i)
        opt.zero_grad()
        loss = F.mse_loss(model(local(x, rank, world)), local(y, rank, world))
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
        history.append(dict(scale=amp.state_dict()["loss_scaler0"]["loss_scale"],
                            params=[p.detach().clone() for p in model.module.parameters()],
                            masters=[m.detach().clone() for m in amp.master_params(opt)]))
    return history


def _o1_model(seed, opt_cls=FusedAdam, **opt_kw):
    model = mlp(seed, width=16)
    opt = opt_cls(model.parameters(), lr=1e-2, **opt_kw)
    model, opt = amp.initialize(model, opt, opt_level="O1", half_dtype=torch.bfloat16,
                                num_losses=2, verbosity=0)
    return DistributedDataParallel(model), opt


def _loss(model, step, rank, world, which):
    x, y = data(step)
    out = model(local(x, rank, world))
    target = local(y, rank, world)
    return F.mse_loss(out.float(), target) if which == "a" else (out.float() - target).abs().mean()


def _backward(model, opt, step, rank, world, which, loss_id=0):
    with amp.scale_loss(_loss(model, step, rank, world, which), opt, loss_id=loss_id) as scaled:
        scaled.backward()


def _grads(model):
    return [p.grad.detach().clone() for p in model.module.parameters()]


def o1_accumulation_with_ddp(rank, world):
    """Grads present before a scale_loss backward (Note [Accumulating under amp]) under
    core_ops' DDP, at O1: two losses per step (a GAN discriminator's real and fake
    losses, each with its own scaler), grads zeroed in place (FusedSGD's default), and
    a no_sync micro-batch before a synced one. Apex's set-aside grads aliased the DDP
    buckets (lost or doubled grads) and skipped the reduction of no_sync grads."""
    out = {}
    # Each loss alone, then both in one step: the grads must add up.
    for which, loss_id in (("a", 0), ("b", 1)):
        model, opt = _o1_model(0)
        opt.zero_grad()
        _backward(model, opt, 0, rank, world, which, loss_id)
        out[which] = _grads(model)
    model, opt = _o1_model(0)
    opt.zero_grad()
    _backward(model, opt, 0, rank, world, "a", 0)
    _backward(model, opt, 0, rank, world, "b", 1)
    out["a+b"] = _grads(model)

    # Grads zeroed in place every step against set to None: the same grads each step.
    in_place, fresh = _o1_model(1, FusedSGD, momentum=0.9), _o1_model(1, FusedSGD, momentum=0.9,
                                                                     set_grad_none=True)
    out["in_place"], out["fresh"] = [], []
    for step in range(3):
        for (model, opt), key in ((in_place, "in_place"), (fresh, "fresh")):
            opt.zero_grad()
            _backward(model, opt, step, rank, world, "a")
            out[key].append(_grads(model))
            opt.step()

    # A no_sync micro-batch, then a synced one: every rank ends with the same grads.
    model, opt = _o1_model(2)
    opt.zero_grad()
    with model.no_sync():
        _backward(model, opt, 0, rank, world, "a")
    _backward(model, opt, 1, rank, world, "a")
    mine = torch.cat([g.flatten() for g in _grads(model)])
    every = [torch.empty_like(mine) for _ in range(world)]
    torch.distributed.all_gather(every, mine)
    out["no_sync_ranks"] = every
    # ...and they are the two micro-batches' grads averaged over the ranks.
    parts = []
    for step in (0, 1):
        single, single_opt = _o1_model(2)
        single_opt.zero_grad()
        _backward(single, single_opt, step, rank, world, "a")
        parts.append(torch.cat([g.flatten() for g in _grads(single)]))
    out["no_sync_expected"] = parts
    return out


def _model_with_batchnorm(seed):
    model = mlp(seed, width=16)
    return torch.nn.Sequential(model[0], torch.nn.BatchNorm1d(16), *list(model)[1:])


def o2_ranks_seeded_apart(rank, world):
    """Each rank builds its model from its own seed (the usual case), initializes O2,
    then wraps it in core_ops' or torch's DistributedDataParallel; Note [Masters follow
    DDP's broadcast]. Returns, per wrapper and optimizer, rank 0's float32 weights
    before initialize, the masters and half weights right after the wrapping, and both
    after each step."""
    wrappers = {"core_ops": DistributedDataParallel,
                "torch": lambda m: torch.nn.parallel.DistributedDataParallel(m)}
    optimizers = {"sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
                  "fused_adam": lambda ps: FusedAdam(ps, lr=1e-2)}
    out = {}
    for wrap_name, wrap in wrappers.items():
        for opt_name, make_opt in optimizers.items():
            model = _model_with_batchnorm(100 + rank)
            fp32 = [p.detach().clone() for p in model.parameters()]
            model, opt = amp.initialize(model, make_opt(model.parameters()), opt_level="O2",
                                        verbosity=0)
            ddp = wrap(model)

            def snapshot():
                return ([p.detach().clone() for p in model.parameters()],
                        [m.detach().clone() for m in amp.master_params(opt)])

            steps = [snapshot()]
            for i in range(3):
                x, y = data(i)
                opt.zero_grad()
                loss = F.mse_loss(ddp(local(x, rank, world)).float(), local(y, rank, world))
                with amp.scale_loss(loss, opt) as scaled:
                    scaled.backward()
                opt.step()
                steps.append(snapshot())
            out[wrap_name, opt_name] = dict(fp32=fp32, steps=steps)
    return out
