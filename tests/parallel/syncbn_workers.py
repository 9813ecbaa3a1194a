"""What each rank runs for test_sync_batchnorm.py: SyncBatchNorm on a slice of a global
batch against torch's BatchNorm on the whole batch (float64), as max differences."""

import copy

import torch
import torch.distributed as dist
from torch import nn

from core_ops.parallel import (DistributedDataParallel, SyncBatchNorm, convert_syncbn_model,
                               create_syncbn_process_group)

BN = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d, 5: nn.BatchNorm3d}

# name: (per-rank batch sizes, shape after the batch dim, options)
CASES = {
    "1d_nc": ((3, 5), (4,), {}),
    "1d_ncl": ((3, 5), (4, 6), {}),
    "2d": ((2, 3), (3, 4, 5), {}),
    "2d_channels_last": ((2, 3), (3, 4, 5), dict(memory_format=torch.channels_last)),
    "2d_apex_channel_last": ((2, 3), (3, 4, 5), dict(channel_last=True)),
    "3d": ((2, 1), (3, 2, 3, 4), {}),
    "3d_channels_last": ((2, 1), (3, 2, 3, 4), dict(memory_format=torch.channels_last_3d)),
    "affine_false": ((3, 2), (4, 5), dict(affine=False)),
    "momentum_none": ((3, 2), (4, 5), dict(momentum=None)),
    "empty_rank": ((4, 0), (3, 5), {}),
}


def _case(rank, world, sizes, shape, opts):
    channel_last = opts.get("channel_last", False)
    fmt = opts.get("memory_format")
    kw = dict(affine=opts.get("affine", True), momentum=opts.get("momentum", 0.1))
    channels = shape[0]
    ref = BN[len(shape) + 1](channels, **kw).double()
    ours = SyncBatchNorm(channels, channel_last=channel_last, **kw).double()
    if kw["affine"]:
        with torch.no_grad():
            ref.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(1))
            ref.bias.uniform_(-1, 1, generator=torch.Generator().manual_seed(2))
        ours.load_state_dict(ref.state_dict())
    begin, end = sum(sizes[:rank]), sum(sizes[:rank + 1])
    diffs = dict(out=0.0, grad_in=0.0, grad_params=0.0, running=0.0)
    for step in range(2):
        g = torch.Generator().manual_seed(10 + step)
        x = torch.randn((sum(sizes),) + shape, generator=g, dtype=torch.float64) * 3 + 1
        dy = torch.randn(x.shape, generator=g, dtype=torch.float64)
        if fmt is not None:
            x = x.contiguous(memory_format=fmt)
        mine = x[begin:end]
        if channel_last:  # Apex's layout: channels are the last dimension
            mine = mine.movedim(1, -1).contiguous()
        mine = mine.detach().requires_grad_()
        xr = x.detach().requires_grad_()
        for m in (ref, ours):
            m.zero_grad()
        yr = ref(xr)
        (yr * dy).sum().backward()
        y = ours(mine)
        y_nc = y.movedim(-1, 1) if channel_last else y
        (y_nc * dy[begin:end]).sum().backward()
        gin = mine.grad.movedim(-1, 1) if channel_last else mine.grad
        diffs["out"] = max(diffs["out"], _max(y_nc, yr[begin:end]))
        diffs["grad_in"] = max(diffs["grad_in"], _max(gin, xr.grad[begin:end]))
        if kw["affine"]:
            summed = torch.cat([ours.weight.grad, ours.bias.grad])
            dist.all_reduce(summed)  # each rank holds its share; DDP would sum them
            diffs["grad_params"] = max(diffs["grad_params"],
                                       _max(summed, torch.cat([ref.weight.grad, ref.bias.grad])))
        diffs["running"] = max(diffs["running"], _max(ours.running_mean, ref.running_mean),
                               _max(ours.running_var, ref.running_var))
    diffs["batches_tracked"] = int(ours.num_batches_tracked)
    diffs["out_channels_last"] = bool(fmt is not None and y.is_contiguous(memory_format=fmt))
    ours.eval()
    ref.eval()
    x = torch.randn((2,) + shape, dtype=torch.float64)
    xin = x.movedim(1, -1) if channel_last else x
    y = ours(xin)
    diffs["eval"] = _max(y.movedim(-1, 1) if channel_last else y, ref(x))
    return diffs


def _max(a, b):
    if a.numel() == 0:
        return 0.0
    return (a.detach() - b.detach()).abs().max().item()


def _subgroups(rank, world):
    """Groups of one rank each: SyncBatchNorm is then plain local BatchNorm."""
    group = create_syncbn_process_group(1)
    ours = SyncBatchNorm(3, process_group=group).double()
    ref = nn.BatchNorm2d(3).double()
    x = torch.randn(2 + rank, 3, 4, 4, dtype=torch.float64, requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    ours(x).square().sum().backward()
    ref(xr).square().sum().backward()
    return dict(out=_max(ours(x), ref(xr)), grad_in=_max(x.grad, xr.grad),
                running=_max(ours.running_var, ref.running_var),
                whole_world=create_syncbn_process_group(world) is None)


def _with_ddp(rank, world):
    torch.manual_seed(0)
    bare = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.Flatten(), nn.Linear(4 * 5 * 5, 3)).double()
    full = copy.deepcopy(bare)
    model = DistributedDataParallel(convert_syncbn_model(bare), message_size=20)
    converted = type(model.module[1]).__name__
    diffs = []
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(6, 2, 5, 5, generator=g, dtype=torch.float64)
        model.zero_grad()
        full.zero_grad()
        model(x[rank * 3:(rank + 1) * 3]).square().mean().backward()
        full(x).square().mean().backward()
        diffs.append(max(_max(a.grad, b.grad) for a, b in zip(model.parameters(), full.parameters())))
        with torch.no_grad():
            for a, b in zip(model.parameters(), full.parameters()):
                a -= 0.1 * a.grad
                b -= 0.1 * b.grad
    running = max(_max(model.module[1].running_var, full[1].running_var),
                  _max(model.module[1].running_mean, full[1].running_mean))
    return dict(converted=converted, grads=max(diffs), running=running)


def _all_empty(rank, world):
    """No rank has a sample: the running stats keep their values (torch's BatchNorm)."""
    ours = SyncBatchNorm(3).double()
    with torch.no_grad():
        ours.running_mean.fill_(5.0)
        ours.running_var.fill_(7.0)
    out = ours(torch.empty(0, 3, 4, dtype=torch.float64))
    return dict(shape=tuple(out.shape), mean=ours.running_mean.tolist(), var=ours.running_var.tolist())


def _eval_alone(rank, world):
    """Eval without running stats on rank 0 only: its own batch statistics, no
    collective (rank 1 goes straight to the barrier; a collective would time out)."""
    result = None
    if rank == 0:
        x = torch.randn(5, 3, 4, dtype=torch.float64)
        ours = SyncBatchNorm(3, track_running_stats=False).double().eval()
        ref = nn.BatchNorm1d(3, track_running_stats=False).double().eval()
        result = _max(ours(x), ref(x))
    dist.barrier()
    return dict(out=result)


def _partial_input_grad(rank, world):
    """Only rank 0's input needs a grad: rank 1 still joins the backward all-reduce,
    and rank 0's input grad is that of BatchNorm on the global batch."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2 * world, 3, 5, generator=g, dtype=torch.float64)
    ours, ref = SyncBatchNorm(3).double(), nn.BatchNorm1d(3).double()
    mine = x[2 * rank:2 * rank + 2].clone().requires_grad_(rank == 0)
    ours(mine).square().sum().backward()
    xr = x.clone().requires_grad_()
    ref(xr).square().sum().backward()
    grad_in = _max(mine.grad, xr.grad[:2]) if rank == 0 else None
    return dict(grad_in=grad_in, weight_grad=ours.weight.grad is not None)


def _double_backward_across(rank, world):
    x = torch.randn(3, 2, 4, dtype=torch.float64, requires_grad=True)
    out = SyncBatchNorm(2).double()(x)
    try:
        torch.autograd.grad(out.pow(3).sum(), x, create_graph=True)
    except RuntimeError as e:
        return dict(error=str(e))
    return dict(error=None)


def fused_add_relu(rank, world):
    """Apex's optimized SyncBatchNorm: ``forward(input, z)`` with ``fuse_relu``, channels
    first and Apex's channel_last, against relu?(BatchNorm(x) + z) on the global batch
    (float64); its group given by ``_specify_process_group``."""
    group = dist.new_group(list(range(world)))
    sizes = (3, 2)
    begin, end = sum(sizes[:rank]), sum(sizes[:rank + 1])
    out = {}
    for channel_last in (False, True):
        for fuse_relu in (False, True):
            g = torch.Generator().manual_seed(7)
            x, z, dy = (torch.randn(sum(sizes), 3, 4, 5, generator=g, dtype=torch.float64)
                        for _ in range(3))
            ref = nn.BatchNorm2d(3).double()
            with torch.no_grad():
                ref.weight.uniform_(0.5, 1.5, generator=g)
                ref.bias.uniform_(-1, 1, generator=g)
            ours = SyncBatchNorm(3, channel_last=channel_last, fuse_relu=fuse_relu).double()
            ours.load_state_dict(ref.state_dict())
            ours._specify_process_group(group)
            xr, zr = x.clone().requires_grad_(), z.clone().requires_grad_()
            yr = ref(xr) + zr
            yr = torch.relu(yr) if fuse_relu else yr
            (yr * dy).sum().backward()
            to_layout = (lambda t: t.movedim(1, -1).contiguous()) if channel_last else (lambda t: t)
            from_layout = (lambda t: t.movedim(-1, 1)) if channel_last else (lambda t: t)
            mine, zm = (to_layout(t[begin:end]).requires_grad_() for t in (x, z))
            y = ours(mine, zm)
            (from_layout(y) * dy[begin:end]).sum().backward()
            params = torch.cat([ours.weight.grad, ours.bias.grad])
            dist.all_reduce(params)  # each rank holds its share; DDP would sum them
            out[(channel_last, fuse_relu)] = dict(
                out=_max(from_layout(y), yr[begin:end]),
                grad_in=_max(from_layout(mine.grad), xr.grad[begin:end]),
                grad_z=_max(from_layout(zm.grad), zr.grad[begin:end]),
                grad_params=_max(params, torch.cat([ref.weight.grad, ref.bias.grad])),
                negatives=bool((y < 0).any()), group_used=ours.process_group is group)
    return out


def suite(rank, world):
    out = {name: _case(rank, world, *spec) for name, spec in CASES.items()}
    out["subgroups"] = _subgroups(rank, world)
    out["ddp"] = _with_ddp(rank, world)
    out["all_empty"] = _all_empty(rank, world)
    out["eval_alone"] = _eval_alone(rank, world)
    out["partial_input_grad"] = _partial_input_grad(rank, world)
    out["double_backward"] = _double_backward_across(rank, world)
    return out
