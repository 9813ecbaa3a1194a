"""Rank functions for test_guards.py: the non-finite guards on 2 gloo ranks, a NaN or
inf injected on rank 1 only, in a bf16 and an fp32 run of each guard."""

import torch
import torch.nn.functional as F
from torch import nn

from core_ops import amp
from core_ops.optimizers import FusedAdam
from core_ops.parallel import DistributedDataParallel

BAD_STEP = 2


def net(dtype):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).to(dtype)


def batch(step, rank):
    g = torch.Generator().manual_seed(10 * step + rank)
    return torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t.detach().clone()


def _snapshot(model, opt):
    return ([_full(p) for p in model.parameters()],
            [_full(v) for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)])


def _run(model, opt, step_fn, rank, poison):
    """4 steps, the poison on rank 1 at BAD_STEP: (before and after that step, finite end)."""
    around = {}
    for step in range(4):
        if step == BAD_STEP:
            around["before"] = _snapshot(model, opt)
        step_fn(*batch(step, rank), poison=(poison if (step, rank) == (BAD_STEP, 1) else None))
        if step == BAD_STEP:
            around["after"] = _snapshot(model, opt)
        opt.zero_grad()
    around["finite"] = all(bool(torch.isfinite(_full(p)).all()) for p in model.parameters())
    return around


def amp_over_ddp(rank, world):
    """amp at O3 (bf16) and O0 (fp32) with skip_nonfinite, core_ops DDP: rank 1's loss NaN
    (bf16) or inf (fp32)."""
    out = {}
    for level, dtype, poison in (("O3", torch.bfloat16, float("nan")), ("O0", torch.float32, float("inf"))):
        model = net(torch.float32)
        opt = FusedAdam(model.parameters(), lr=1e-2)
        model, opt = amp.initialize(model, opt, opt_level=level, half_dtype=torch.bfloat16, verbosity=0,
                                    skip_nonfinite=True)
        ddp = DistributedDataParallel(model)

        def step_fn(x, y, poison):
            loss = F.mse_loss(ddp(x.to(dtype)).float(), y) * (1.0 if poison is None else poison)
            with amp.scale_loss(loss, opt) as scaled:
                scaled.backward()
            opt.step()

        out[level] = _run(model, opt, step_fn, rank, poison)
        out[level]["skipped"] = amp.skipped_steps()
    return out


def fused_adam_on_fsdp2(rank, world):
    """FusedAdam(skip_nonfinite=True) without amp on FSDP2 shards, bf16 and fp32 params: one
    element of rank 1's local grad shard set non-finite after the reduce-scatter, so only
    rank 1 sees it (the flag goes over every rank's shards)."""
    from torch.distributed.fsdp import fully_shard
    out = {}
    for name, dtype, poison in (("bf16", torch.bfloat16, float("nan")), ("fp32", torch.float32, float("inf"))):
        model = net(dtype)
        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
        opt = FusedAdam(model.parameters(), lr=1e-2, skip_nonfinite=True)

        def step_fn(x, y, poison):
            F.mse_loss(model(x.to(dtype)).float(), y).backward()
            if poison is not None:
                model[0].weight.grad.to_local().view(-1)[3] = poison
            opt.step()

        out[name] = _run(model, opt, step_fn, rank, poison)
        out[name]["skipped"] = opt.skipped_steps
    return out
