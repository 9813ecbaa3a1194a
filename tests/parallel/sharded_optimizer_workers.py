"""Rank functions for test_sharded_optimizers.py: models sharded by FSDP2's fully_shard
(params are DTensors), trained by core_ops' fused optimizers (the registry's,
tests/optimizers/optimizer_registry.py, generic test "sharded") and by torch.optim."""

import functools
import itertools
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "optimizers"))
from optimizer_registry import cases  # noqa: E402

# Elementwise on the shards, each variant against the torch.optim optimizer of its
# kwargs: {name: (ours, torch's)}.
PAIRS = {case.id: (functools.partial(case.values[0].make, config=case.values[1]),
                   functools.partial(case.values[0].torch_optimizer, **case.values[1].kwargs))
         for case in cases("sharded", "torch_counterpart", variants=True)}


def sharded_mlp(mesh=None):
    """The MLP sharded by FSDP2 over ``mesh`` (default: every rank; a 2-d mesh is HSDP:
    replicated over its first dim, sharded over its second)."""
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def train(make_opt, rank, steps=4):
    model = sharded_mlp()
    opt = make_opt(model.parameters())
    g = torch.Generator().manual_seed(1 + rank)  # each rank its own batches
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 6, generator=g)).pow(2).sum().backward()
        opt.step()
    return model, opt


def elementwise_optimizers(rank, world):
    out = {}
    for name, (ours, theirs) in PAIRS.items():
        model, opt = train(ours, rank)
        reference, _ = train(theirs, rank)
        out[name] = {
            "ours": [p.full_tensor() for p in model.parameters()],
            "torch": [p.full_tensor() for p in reference.parameters()],
            "state_types": sorted({type(v).__name__ for s in opt.state.values() for v in s.values()
                                   if isinstance(v, torch.Tensor) and v.dim()}),
        }
    return out


# Optimizers and options that need each whole tensor's norm, or the global one: {name:
# (make, step kwargs, all_reduce calls a step makes)}. Each entry that takes norms, in
# every variant (one all_reduce a norm pass for all tensors: LAMB's clipping norm, then
# its weights' and updates' norms together; NovoGrad's grad norms); and the elementwise
# ones clipped by step(max_grad_norm=): one for the global norm.
WHOLE_NORMS = {
    **{case.id: (functools.partial(case.values[0].make, config=case.values[1]), {}, case.values[0].collectives)
       for case in cases("sharded", variants=True) if case.values[0].collectives},
    **{f"{case.id}_clipped": (case.values[0].make, {"max_grad_norm": 0.5}, 1)
       for case in cases("sharded", "torch_counterpart")},
}


def whole_norm_optimizers(rank, world):
    """Each optimizer of WHOLE_NORMS on the sharded MLP against the same optimizer on
    an unsharded copy fed every rank's batch (FSDP2 averages the ranks' grads), and
    the all_reduce calls each step made."""
    import torch.distributed as dist
    calls = []
    all_reduce = dist.all_reduce

    def counted(*args, **kwargs):
        calls.append(1)
        return all_reduce(*args, **kwargs)

    meshes = {"fsdp": None}
    if world == 4:
        from torch.distributed.device_mesh import init_device_mesh
        meshes["hsdp"] = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    out = {}
    for (name, (make, step_kwargs, _)), (layout, mesh) in itertools.product(WHOLE_NORMS.items(), meshes.items()):
        model = sharded_mlp(mesh)
        torch.manual_seed(0)
        whole = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
        opt, ref = make(model.parameters()), make(whole.parameters())
        batches = [torch.Generator().manual_seed(1 + r) for r in range(world)]
        per_step = []
        for _ in range(4):
            xs = [torch.randn(4, 6, generator=g) for g in batches]
            opt.zero_grad()
            ref.zero_grad()
            model(xs[rank]).pow(2).sum().backward()
            (sum(whole(x).pow(2).sum() for x in xs) / world).backward()
            calls.clear()
            dist.all_reduce = counted
            try:
                opt.step(**step_kwargs)
            finally:
                dist.all_reduce = all_reduce
            per_step.append(len(calls))
            ref.step(**step_kwargs)
        out[f"{name} {layout}"] = {"sharded": [p.full_tensor() for p in model.parameters()],
                     "whole": [p.detach().clone() for p in whole.parameters()],
                     "all_reduces": per_step,
                     "grad_norm": getattr(opt, "last_grad_norm", None),
                     "whole_grad_norm": getattr(ref, "last_grad_norm", None)}
    return out


def under_loss_scalers(rank, world):
    """torch's AdamW and FusedAdam, each under torch.amp.GradScaler and under
    core_ops' LossScaler, on sharded params, with an inf in rank 0's shard of a grad
    at step 1: every rank skips that step."""
    from core_ops.amp import LossScaler
    runs = {"torch": (PAIRS["adam"][1], torch.amp.GradScaler),
            "ours_grad_scaler": (PAIRS["adam"][0], torch.amp.GradScaler),
            "ours_loss_scaler": (PAIRS["adam"][0], LossScaler),
            "torch_loss_scaler": (PAIRS["adam"][1], LossScaler)}  # unscale_ on the shards
    out = {}
    for name, (make, make_scaler) in runs.items():
        model = sharded_mlp()
        opt = make(model.parameters())
        scaler = make_scaler("cpu", init_scale=2.0 ** 8)
        g = torch.Generator().manual_seed(1 + rank)
        for step in range(3):
            opt.zero_grad()
            scaler.scale(model(torch.randn(4, 6, generator=g)).pow(2).sum()).backward()
            if step == 1 and rank == 0:
                next(model.parameters()).grad.to_local().view(-1)[0] = float("inf")
            scaler.step(opt)
            scaler.update()
        out[name] = ([p.full_tensor() for p in model.parameters()], scaler.get_scale())
    return out
