"""What each rank runs for test_ddp_edge_cases.py: DistributedDataParallel under
reentrant activation checkpointing, with sparse or lazy modules, on an explicit default
group shared with SyncBatchNorm, and deep-copied. Each scenario is its own launch, so
that one that crashes a rank (a gloo abort) fails its test alone. The ground truth is
each rank's local grads of an unwrapped copy, averaged (or summed) by hand."""

import copy

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

import core_ops.parallel._groups as groups
from core_ops.parallel import DistributedDataParallel, SyncBatchNorm
from ddp_workers import data, grads, local, loss_fn, max_diff, mlp, zero


def hand_reduced(model, average=True):
    """``model``'s local grads summed over the ranks (divided by the world size when
    ``average``); a missing grad counts as zeros."""
    out = []
    for p in model.parameters():
        g = torch.zeros_like(p) if p.grad is None else p.grad.clone()
        dist.all_reduce(g)
        out.append(g / dist.get_world_size() if average else g)
    return out


def _batch(step, rank):
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(100 + 2 * step + rank))


class SharedCheckpointed(nn.Module):
    """One block used by two checkpointed segments (ALBERT-style sharing): with
    use_reentrant=True each segment runs its own backward, so the shared params' grads
    are accumulated, and their hooks fire, twice in one backward."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp, self.shared, self.out = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 1)

    def forward(self, x):
        h = self.inp(x)
        for _ in range(2):
            h = checkpoint(lambda t: torch.tanh(self.shared(t)), h, use_reentrant=True)
        return self.out(h)


def _shared_diffs(rank, **ddp_kwargs):
    """Differences from the hand-reduced grads over 3 steps, grads zeroed in place
    (they are the bucket's views) and set to None."""
    diffs = []
    for set_to_none in (False, True):
        ref, model = SharedCheckpointed(), DistributedDataParallel(SharedCheckpointed(), **ddp_kwargs)
        for step in range(3):
            zero(model, set_to_none)
            zero(ref, set_to_none)
            model(_batch(step, rank)).pow(2).sum().backward()
            ref(_batch(step, rank)).pow(2).sum().backward()
            diffs.append(max_diff(grads(model), hand_reduced(ref)))
    return diffs


def shared_reentrant(rank, world):
    """The shared params' second ready comes before their bucket is sent with one
    bucket for all (message_size 10M): the bucket takes the grown grads (views are
    scaled only when sent), averaged after the sum or pre-divided. With one bucket per
    param the first ready sent it: an error."""
    diffs = _shared_diffs(rank) + _shared_diffs(rank, gradient_predivide_factor=2.0)
    model = DistributedDataParallel(SharedCheckpointed(), message_size=1)
    try:
        model(_batch(0, rank)).pow(2).sum().backward()
        model(_batch(1, rank)).pow(2).sum().backward()
        error = None
    except RuntimeError as e:
        error = str(e)
    return {"diffs": diffs, "errors": [error]}


def shared_reentrant_delay(rank, world):
    """delay_allreduce=True reduces the twice-accumulated grads once, after backward."""
    return _shared_diffs(rank, delay_allreduce=True)


class CheckpointedHead(nn.Module):
    """The last blocks under a reentrant checkpoint: the first grads become ready in
    the nested backward of the checkpoint, before the outer backward reaches the rest."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp, self.blk, self.out = nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 1)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        return checkpoint(lambda t: self.out(torch.tanh(self.blk(t))), h, use_reentrant=True)


def _count_allreduces():
    calls = []
    real = dist.all_reduce

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    dist.all_reduce = counting
    return calls, lambda: setattr(dist, "all_reduce", real)


def checkpointed_head(rank, world):
    """One finish per backward, in the outer one: every bucket allreduced once per
    step, and grads equal to the hand-reduced ones, averaged or summed."""
    out = {}
    for average in (True, False):
        for message_size in (10_000_000, 1):
            ref = CheckpointedHead()
            model = DistributedDataParallel(CheckpointedHead(), message_size=message_size,
                                            gradient_average=average)
            diffs, counts = [], []
            for step in range(3):
                x = torch.randn(5, 4, generator=torch.Generator().manual_seed(2 * step + rank))
                zero(model, True)
                zero(ref, True)
                calls, restore = _count_allreduces()
                try:
                    model(x).pow(2).mean().backward()
                finally:
                    restore()
                counts.append(len(calls))
                ref(x).pow(2).mean().backward()
                diffs.append(max_diff(grads(model), hand_reduced(ref, average)))
            out[(average, message_size)] = dict(diffs=diffs, allreduces=counts,
                                                buckets=len(model._grads.buckets))
    return out


def sparse(rank, world):
    """Sparse embeddings are refused at construction; a module switched to sparse
    after wrapping fails in the hook, naming the param."""
    errors = {}
    try:
        DistributedDataParallel(nn.Sequential(nn.Embedding(10, 3, sparse=True), nn.Linear(3, 1)))
    except ValueError as e:
        errors["construction"] = str(e)
    model = nn.Sequential(nn.EmbeddingBag(10, 3), nn.Linear(3, 1))
    wrapped = DistributedDataParallel(model)
    model[0].sparse = True
    try:
        wrapped(torch.tensor([[1, 2], [3, 4]])).sum().backward()
    except RuntimeError as e:
        errors["backward"] = str(e)
    frozen = nn.Sequential(nn.Embedding(10, 3, sparse=True), nn.Linear(3, 1))
    frozen[0].weight.requires_grad_(False)
    DistributedDataParallel(frozen)(torch.tensor([1, 2])).sum().backward()  # nothing sparse to reduce
    return errors


class SyncBNWithBranch(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.bn, self.b = nn.Linear(4, 6), SyncBatchNorm(6), nn.Linear(6, 6)
        self.branch, self.c = nn.Linear(6, 6), nn.Linear(6, 1)

    def forward(self, x, use_branch):
        h = self.b(torch.relu(self.bn(self.a(x))))
        if use_branch:
            h = h + self.branch(h)
        return self.c(h)


def explicit_world_group(rank, world):
    """process_group=dist.group.WORLD, which SyncBatchNorm uses too, and a branch used
    on rank 0 only with one bucket per param: rank 1 holds back the branch's bucket, so
    on a shared group its allreduces would meet SyncBatchNorm's in another order."""
    ref = SyncBNWithBranch()
    model = DistributedDataParallel(SyncBNWithBranch(), message_size=1,
                                    process_group=dist.group.WORLD)
    diffs = []
    for step in range(3):
        x = torch.randn(5, 4, generator=torch.Generator().manual_seed(2 * step + rank))
        zero(model, True)
        zero(ref, True)
        model(x, rank == 0).pow(2).mean().backward()
        ref(x, rank == 0).pow(2).mean().backward()
        diffs.append(max_diff([torch.zeros_like(p) if p.grad is None else p.grad
                               for p in model.parameters()], hand_reduced(ref)))
    return dict(diffs=diffs, private=model.process_group is not dist.group.WORLD)


def _count_collectives():
    """Counts the collectives DistributedDataParallel uses (all_reduce, broadcast, the
    all-gather of its checks, new_group); returns (calls, restore)."""
    calls = []
    patched = [(dist, "all_reduce"), (dist, "broadcast"), (dist, "new_group"),
               (groups, "_all_gather_flat")]
    reals = [getattr(owner, name) for owner, name in patched]
    for (owner, name), real in zip(patched, reals):
        setattr(owner, name, lambda *a, real=real, name=name, **k: (calls.append(name),
                                                                     real(*a, **k))[1])

    def restore():
        for (owner, name), real in zip(patched, reals):
            setattr(owner, name, real)
    return calls, restore


def deep_copied(rank, world):
    """copy.deepcopy of the wrapper after a step (an EMA model, a teacher): no
    collective while copying, and both the copy and the original then train as
    DistributedDataParallel, each its own params."""
    model = DistributedDataParallel(mlp(100), message_size=40)
    x, y = data(0)
    loss_fn(model(local(x, rank, world)), local(y, rank, world)).backward()
    calls, restore = _count_collectives()
    try:
        twin = copy.deepcopy(model)
    finally:
        restore()
    shares = [a.data_ptr() == b.data_ptr() for a, b in zip(model.parameters(), twin.parameters())]
    result = dict(collectives=calls, grads_none=all(p.grad is None for p in twin.parameters()),
                  shares_storage=any(shares), same_group=twin.process_group is model.process_group)
    ref, ref_twin = mlp(100), mlp(100)
    with torch.no_grad():
        for p in twin.parameters():
            p.add_(0.5)  # the copy drifts from the original, as an EMA does
        for p, q in zip(ref_twin.parameters(), twin.parameters()):
            p.copy_(q)
    diffs = []
    for step in (1, 2):
        x, y = data(step)
        xl, yl = local(x, rank, world), local(y, rank, world)
        for m in (model, twin, ref, ref_twin):
            zero(m, True)
        for m, r in ((twin, ref_twin), (model, ref)):
            loss_fn(m(xl), yl).backward()
            loss_fn(r(xl), yl).backward()
            diffs.append(max_diff(grads(m), hand_reduced(r)))
    result.update(diffs=diffs)
    return result
