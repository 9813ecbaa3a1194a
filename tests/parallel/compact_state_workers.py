"""Rank functions for test_compact_state_parallel.py: FusedAdam with compact state
(master_weights="remainder", state_dtype="int8") under DDP and FSDP2, against fp32
masters, and resumed from each rank's saved state."""

import io

import torch
from torch import nn

from core_ops.optimizers import FusedAdam

STEPS, RESUME_AT = 8, 3


def mlp(seed=0):
    torch.manual_seed(seed)
    # 64 x 128 weights: 8192 elements, 8-bit moments (4096 per shard on 2 ranks).
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64)).bfloat16()


def batches(rank):
    g = torch.Generator().manual_seed(10 + rank)  # each rank its own data
    return [torch.randn(16, 64, generator=g).bfloat16() for _ in range(STEPS)]


def step(model, opt, x):
    opt.zero_grad()
    model(x).float().pow(2).mean().backward()
    opt.step()


def snapshot(model, full):
    return [(p.full_tensor() if full else p).detach().clone() for p in model.parameters()]


def saved(opt):
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    return buffer


def train(wrap, rank, **opt_kw):
    """(params after every step, params of a run resumed at RESUME_AT from saved state,
    the optimizer) for a model made by ``wrap``."""
    data = batches(rank)
    model = wrap(mlp())
    opt = FusedAdam(model.parameters(), lr=1e-2, weight_decay=0.01, **opt_kw)
    full = hasattr(next(model.parameters()), "full_tensor")
    seen = []
    checkpoint = None
    for i, x in enumerate(data):
        if i == RESUME_AT:
            checkpoint = ({k: v.detach().clone() for k, v in model.state_dict().items()}, saved(opt))
        step(model, opt, x)
        seen.append(snapshot(model, full))
    # The resumed run: a fresh model and optimizer loading what was saved at RESUME_AT.
    resumed = wrap(mlp(seed=7))
    resumed.load_state_dict(checkpoint[0])
    opt2 = FusedAdam(resumed.parameters(), lr=1e-2, weight_decay=0.01, **opt_kw)
    opt2.load_state_dict(torch.load(checkpoint[1], weights_only=False))
    for x in data[RESUME_AT:]:
        step(resumed, opt2, x)
    return seen, snapshot(resumed, full), opt


CONFIGS = (("masters", dict(master_weights=True)), ("remainders", dict(master_weights="remainder")),
           ("compact", dict(master_weights="remainder", state_dtype="int8")))


def state_layout(opt):
    out = {}
    for p, s in opt.state.items():
        for k, v in s.items():
            if isinstance(v, torch.Tensor):
                local = v.to_local() if hasattr(v, "to_local") else v
                out.setdefault(k, set()).add((str(local.dtype), type(v).__name__))
    return {k: sorted(v) for k, v in out.items()}


def ddp(rank, world):
    from core_ops.parallel import DistributedDataParallel
    out = {}
    for name, kw in CONFIGS:
        seen, resumed, opt = train(DistributedDataParallel, rank, **kw)
        out[name] = dict(seen=seen, resumed=resumed, layout=state_layout(opt))
    return out


def sharded(model):
    from torch.distributed.fsdp import fully_shard
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    return fully_shard(model)


def fsdp(rank, world):
    out = {}
    for name, kw in CONFIGS:
        seen, resumed, opt = train(sharded, rank, **kw)
        out[name] = dict(seen=seen, resumed=resumed, layout=state_layout(opt))
    out["dcp"] = fsdp_dcp(rank)
    return out


def fsdp_dcp(rank):
    """The compact FSDP2 run saved at RESUME_AT with torch.distributed.checkpoint (model
    and optimizer, torch's get_*_state_dict helpers) and resumed into a fresh model and
    optimizer: the params after the last step, straight and resumed."""
    import tempfile
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                         set_model_state_dict, set_optimizer_state_dict)
    where = [tempfile.mkdtemp() if rank == 0 else None]
    dist.broadcast_object_list(where, src=0)
    kw = dict(lr=1e-2, weight_decay=0.01, master_weights="remainder", state_dtype="int8")
    data = batches(rank)
    model = sharded(mlp())
    opt = FusedAdam(model.parameters(), **kw)
    for i, x in enumerate(data):
        if i == RESUME_AT:
            dcp.save({"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)},
                     checkpoint_id=where[0])
        step(model, opt, x)
    resumed = sharded(mlp(seed=7))
    opt2 = FusedAdam(resumed.parameters(), **kw)
    state = {"model": get_model_state_dict(resumed), "optim": get_optimizer_state_dict(resumed, opt2)}
    dcp.load(state, checkpoint_id=where[0])
    set_model_state_dict(resumed, state["model"])
    set_optimizer_state_dict(resumed, opt2, state["optim"])
    for x in data[RESUME_AT:]:
        step(resumed, opt2, x)
    return dict(straight=snapshot(model, True), resumed=snapshot(resumed, True))


def both(rank, world):
    return {"ddp": ddp(rank, world), "fsdp": fsdp(rank, world)}
