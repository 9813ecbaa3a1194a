"""What each rank runs for test_ddp.py: scenarios that return numbers (max differences,
counts, orders of events) for the tests to assert on. Run by _launch.run_ranks."""

import copy
import time

import torch
import torch.distributed as dist
from torch import nn

from core_ops.parallel import DistributedDataParallel, Reducer

GLOBAL_BATCH = 8


def mlp(seed, width=12, depth=3, dtype=torch.float32):
    torch.manual_seed(seed)
    layers = [nn.Linear(6, width), nn.Tanh()]
    for _ in range(depth - 2):
        layers += [nn.Linear(width, width), nn.Tanh()]
    layers.append(nn.Linear(width, 3))
    return nn.Sequential(*layers).to(dtype)


def data(step, dtype=torch.float32):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(GLOBAL_BATCH, 6, generator=g).to(dtype), torch.randn(GLOBAL_BATCH, 3, generator=g).to(dtype)


def local(t, rank, world):
    n = t.shape[0] // world
    return t[rank * n:(rank + 1) * n]


def loss_fn(out, target):
    return ((out.float() - target.float()) ** 2).mean()


def grads(model):
    return [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]


def rank_grads(model, world):
    """Every rank's local grads of ``model``, flattened in float64, in rank order."""
    mine = torch.cat([p.grad.double().flatten() for p in model.parameters()])
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    return every


def max_diff(a, b):
    return max((x.double() - y.double()).abs().max().item() for x, y in zip(a, b))


def zero(model, set_to_none):
    for p in model.parameters():
        if p.grad is not None:
            if set_to_none:
                p.grad = None
            else:
                p.grad.zero_()


def _fp32(rank, world, delay):
    ours = DistributedDataParallel(mlp(100 + rank), message_size=40, delay_allreduce=delay)
    theirs = nn.parallel.DistributedDataParallel(mlp(100))
    full = mlp(100)
    after_broadcast = max_diff([p.detach() for p in ours.parameters()],
                               [p.detach() for p in full.parameters()])
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ours, theirs, full)]
    vs_full, vs_torch = [], []
    for step in range(3):
        x, y = data(step)
        for m in (ours, theirs, full):
            zero(m, set_to_none=step != 2)  # the last step accumulates into the buffers
        loss_fn(ours(local(x, rank, world)), local(y, rank, world)).backward()
        loss_fn(theirs(local(x, rank, world)), local(y, rank, world)).backward()
        loss_fn(full(x), y).backward()
        vs_full.append(max_diff(grads(ours), grads(full)))
        vs_torch.append(max_diff(grads(ours), grads(theirs)))
        for o in opts:
            o.step()
    buffers = {b.data_ptr(): b for b in ours.allreduce_buffers}
    in_buffers = all(any(b.data_ptr() <= p.grad.data_ptr() < b.data_ptr() + b.numel() * b.element_size()
                         for b in buffers.values()) for p in ours.parameters())
    return dict(after_broadcast=after_broadcast, vs_full=vs_full, vs_torch=vs_torch,
                buckets=len(ours._grads.buckets), grads_in_buffers=in_buffers,
                params=[p.detach().clone() for p in ours.parameters()])


def _half(rank, world, dtype, always_fp32):
    ours = DistributedDataParallel(mlp(100, dtype=dtype), message_size=40,
                                   allreduce_always_fp32=always_fp32)
    theirs = nn.parallel.DistributedDataParallel(mlp(100, dtype=dtype))
    exact = copy.deepcopy(mlp(100, dtype=dtype)).double()
    errs_ours, errs_torch = [], []
    for step in range(2):
        x, y = data(step)
        for m in (ours, theirs, exact):
            zero(m, True)
        loss_fn(ours(local(x, rank, world).to(dtype)), local(y, rank, world)).backward()
        loss_fn(theirs(local(x, rank, world).to(dtype)), local(y, rank, world)).backward()
        loss_fn(exact(x.to(dtype).double()), y.to(dtype).double()).backward()
        errs_ours.append(max_diff(grads(ours), grads(exact)))
        errs_torch.append(max_diff(grads(theirs), grads(exact)))
    return dict(err_ours=max(errs_ours), err_torch=max(errs_torch),
                grad_dtypes=sorted({str(p.grad.dtype) for p in ours.parameters()}),
                buffer_dtypes=sorted({str(b.dtype) for b in ours._grads.buckets}))


def _compressed(rank, world, dtype, model_dtype=torch.float32):
    """An fp32 model whose grads are reduced in ``dtype`` (allreduce_dtype). Expected,
    exactly: each rank's grad times 1/world rounded to ``dtype`` (one rounding, fused
    into the copy; fp16 too, as torch's fp16_compress_hook, Note [Averaging]), the two
    summed with one rounding (gloo adds two values; with more ranks the sum would
    round at each addition), widened to fp32."""
    ours = DistributedDataParallel(mlp(100, dtype=model_dtype), message_size=40, allreduce_dtype=dtype)
    plain = mlp(100, dtype=model_dtype)
    diffs, buffers = [], []
    for step in range(2):
        x, y = data(step)
        zero(ours, set_to_none=step == 0)  # the second step accumulates in fp32 .grad
        zero(plain, True)
        x = x.to(model_dtype)
        loss_fn(ours(local(x, rank, world)), local(y, rank, world)).backward()
        loss_fn(plain(local(x, rank, world)), local(y, rank, world)).backward()
        # The sum of two values of ``dtype`` is exact in float64, then rounded once.
        sent = [(g / world).to(dtype).double() for g in rank_grads(plain, world)]
        expected = sum(sent).to(dtype).double()
        got = torch.cat([p.grad.double().flatten() for p in ours.parameters()])
        diffs.append((got - expected).abs().max().item())
        buffers.append([b.data_ptr() for b in ours.allreduce_buffers])
    return dict(diffs=diffs, grad_dtypes=sorted({str(p.grad.dtype).removeprefix("torch.")
                                                 for p in ours.parameters()}),
                buffer_dtypes=sorted({str(b.dtype) for b in ours._grads.buckets}),
                same_buffers=len(buffers[0]) == len(ours._grads.buckets) and buffers[0] == buffers[1])


class MixedDtypes(nn.Module):
    """An fp32 layer after a bf16 one: backward makes the fp32 grads first, so one
    bucket of a given buffer dtype would start with an fp32 param and go on with bf16."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(11)
        self.a = nn.Linear(6, 12).bfloat16()
        self.b = nn.Linear(12, 3)

    def forward(self, x):
        return self.b(self.a(x.bfloat16()).float().tanh())


def _mixed_dtypes(rank, world):
    """fp32 and bf16 params in one model, reduced in fp32 (allreduce_always_fp32) or in
    bf16 (allreduce_dtype): every grad keeps its param's dtype and equals the average
    of the ranks' local grads within bf16 rounding."""
    out = {}
    for name, kwargs in (("always_fp32", dict(allreduce_always_fp32=True)),
                         ("as_bf16", dict(allreduce_dtype=torch.bfloat16))):
        ours = DistributedDataParallel(MixedDtypes(), message_size=1000, **kwargs)
        plain = MixedDtypes()
        errs = []
        for step in range(2):
            x, y = data(step)
            zero(ours, True)
            zero(plain, True)
            loss_fn(ours(local(x, rank, world)), local(y, rank, world)).backward()
            loss_fn(plain(local(x, rank, world)), local(y, rank, world)).backward()
            expected = sum(rank_grads(plain, world)) / world
            got = torch.cat([p.grad.double().flatten() for p in ours.parameters()])
            errs.append(((got - expected).abs().max() / expected.abs().max()).item())
        out[name] = dict(err=max(errs), dtypes_match=all(p.grad.dtype == p.dtype for p in ours.parameters()))
    return out


def _no_sync_then_unused(rank, world):
    """A param that got grads only inside no_sync keeps them through the synced
    backward that does not use it: reduced like the others, not zeroed or dropped."""
    ours = DistributedDataParallel(Branchy(), message_size=8)
    ref = Branchy()
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(3, 4, generator=g) for _ in range(2 * world)]
    with ours.no_sync():
        ours(xs[rank], use_b=True).square().mean().backward()
    ours(xs[world + rank], use_b=False).square().mean().backward()
    for r in range(world):
        (ref(xs[r], use_b=True).square().mean() / world).backward()
        (ref(xs[world + r], use_b=False).square().mean() / world).backward()
    b = ours.module.b
    return dict(b_grads=None if b.weight.grad is None else
                max_diff([b.weight.grad, b.bias.grad], [ref.b.weight.grad, ref.b.bias.grad]),
                a=max_diff([ours.module.a.weight.grad], [ref.a.weight.grad]))


def _failed_finish_then_step(rank, world):
    """A failure while the grads are handed back (here, one injected error) leaves no
    stale bucket behind: the next step's grads equal the full-batch ones."""
    ours = DistributedDataParallel(mlp(100), message_size=40)
    full = mlp(100)
    x, y = data(0)
    loss_fn(ours(local(x, rank, world)), local(y, rank, world)).backward()  # fixes the layout
    bucket = ours._grads.buckets[-1]
    real = bucket.write_back

    def fail_once(used):
        bucket.write_back = real
        raise RuntimeError("injected")
    bucket.write_back = fail_once
    zero(ours, True)
    raised = False
    try:
        loss_fn(ours(local(x, rank, world)), local(y, rank, world)).backward()
    except RuntimeError as e:
        raised = "injected" in str(e)
    x, y = data(1)
    zero(ours, True)
    loss_fn(ours(local(x, rank, world)), local(y, rank, world)).backward()
    loss_fn(full(x), y).backward()
    return dict(raised=raised, diff=max_diff(grads(ours), grads(full)))


def _no_sync(rank, world):
    ours = DistributedDataParallel(mlp(100), message_size=40)
    full = mlp(100)
    calls = []
    real = dist.all_reduce
    dist.all_reduce = lambda *a, **k: (calls.append(1), real(*a, **k))[1]
    diffs, inside = [], []
    try:
        for step in range(2):
            x, y = data(step)
            zero(ours, True)
            zero(full, True)
            xl, yl = local(x, rank, world), local(y, rank, world)
            with ours.no_sync():
                n0 = len(calls)
                (loss_fn(ours(xl[:2]), yl[:2]) / 2).backward()
                inside.append(len(calls) - n0)
            (loss_fn(ours(xl[2:]), yl[2:]) / 2).backward()
            loss_fn(full(x), y).backward()
            diffs.append(max_diff(grads(ours), grads(full)))
    finally:
        dist.all_reduce = real
    return dict(vs_full=diffs, allreduces_inside_no_sync=inside)


def _no_sync_forward_decides(rank, world):
    """torch's rule, on both wrappers side by side: a forward inside no_sync() is not
    reduced even when its backward runs after the block; a forward outside is, even
    when its backward runs inside."""
    x, y = data(0)
    xl, yl = local(x, rank, world), local(y, rank, world)
    ours = DistributedDataParallel(mlp(100), message_size=40)
    theirs = nn.parallel.DistributedDataParallel(mlp(100))
    after = {}
    for name, model in (("ours", ours), ("theirs", theirs)):
        zero(model, True)
        with model.no_sync():
            out = model(xl[:2])
        loss_fn(out, yl[:2]).backward()
        first = grads(model)
        out = model(xl[2:])
        with model.no_sync():
            loss_fn(out, yl[2:]).backward()
        after[name] = (first, grads(model))
    mine = torch.cat([g.flatten() for g in after["ours"][0]])
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    return dict(first_local=max_diff([every[0]], [every[1]]) > 1e-3,
                first=max_diff(after["ours"][0], after["theirs"][0]),
                second=max_diff(after["ours"][1], after["theirs"][1]))


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.a, self.b, self.c, self.frozen = (nn.Linear(4, 4) for _ in range(4))
        self.frozen.requires_grad_(False)

    def forward(self, x, use_b):
        h = self.a(x).tanh()
        if use_b:
            h = h + self.b(x).tanh()
        return self.frozen(h)


def _unused(rank, world):
    ours = DistributedDataParallel(Branchy(), message_size=8)
    ref = Branchy()
    results = []
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        xs = [torch.randn(3, 4, generator=g) for _ in range(world)]
        zero(ours, True)
        zero(ref, True)
        ours(xs[rank], use_b=rank == 1).square().mean().backward()
        sum(ref(xs[r], use_b=r == 1).square().mean() for r in range(world)).div(world).backward()
        results.append(dict(
            a=max_diff([ours.module.a.weight.grad, ours.module.a.bias.grad],
                       [ref.a.weight.grad, ref.a.bias.grad]),
            b=max_diff([ours.module.b.weight.grad, ours.module.b.bias.grad],
                       [ref.b.weight.grad, ref.b.bias.grad]),
            c_none=ours.module.c.weight.grad is None and ours.module.c.bias.grad is None,
            frozen_none=ours.module.frozen.weight.grad is None))
    return results


def _overlap(rank, world):
    model = mlp(100, width=32, depth=8)
    ours = DistributedDataParallel(model, message_size=32 * 33)
    x, y = data(0)
    loss_fn(ours(local(x, rank, world)), local(y, rank, world)).backward()  # fixes the layout
    events = []
    for i, p in enumerate(model.parameters()):
        p.register_post_accumulate_grad_hook(lambda p, i=i: events.append(("grad", i, time.perf_counter())))
    real = dist.all_reduce

    def recording(tensor, *a, **k):
        events.append(("launch", tensor.numel(), time.perf_counter()))
        return real(tensor, *a, **k)

    dist.all_reduce = recording
    try:
        zero(ours, True)
        loss_fn(ours(local(x, rank, world)), local(y, rank, world)).backward()
        events.append(("backward returned", 0, time.perf_counter()))
    finally:
        dist.all_reduce = real
    kinds = [e[0] for e in events]
    return dict(kinds=kinds, buckets=len(ours._grads.buckets),
                first_launch=kinds.index("launch"),
                last_grad=len(kinds) - 1 - kinds[::-1].index("grad"))


def _scaling(rank, world):
    out = {}
    x, y = data(0)
    ref = mlp(100)
    loss_fn(ref(x), y).backward()
    for name, kwargs, factor in (("predivide", dict(gradient_predivide_factor=2.0), 1.0),
                                 ("sum", dict(gradient_average=False), world),
                                 ("sum_predivide", dict(gradient_average=False,
                                                        gradient_predivide_factor=4.0), world / 4)):
        ours = DistributedDataParallel(mlp(100), **kwargs)
        for _ in range(2):
            zero(ours, True)
            loss_fn(ours(local(x, rank, world)), local(y, rank, world)).backward()
        out[name] = max_diff(grads(ours), [g * factor for g in grads(ref)])
    model = mlp(100)
    trigger = DistributedDataParallel(model, allreduce_trigger_params=[model[2].weight])
    for _ in range(2):
        zero(trigger, True)
        loss_fn(trigger(local(x, rank, world)), local(y, rank, world)).backward()
    out["trigger_buckets"] = len(trigger._grads.buckets)
    out["trigger"] = max_diff(grads(trigger), grads(ref))
    return out


class WithBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("offset", torch.zeros(3))

    def forward(self, x):
        return self.lin(x) + self.offset


def _state_and_buffers(rank, world):
    bare = WithBuffer()
    ours = DistributedDataParallel(bare)
    keys = sorted(ours.state_dict())
    with torch.no_grad():
        ours.module.offset.fill_(float(rank * 7))
    ours(torch.ones(2, 3))
    offset_after_forward = ours.module.offset.tolist()
    other = WithBuffer()
    with torch.no_grad():
        other.offset.fill_(3.0)
    ours.load_state_dict(other.state_dict())  # a bare model's keys
    loaded_bare = ours.module.offset.tolist()
    prefixed = {"module." + k: v * 0 + 5 for k, v in other.state_dict().items()}
    ours.load_state_dict(prefixed)  # torch DDP's keys
    loaded_prefixed = ours.module.offset.tolist()
    fresh = WithBuffer()
    fresh.load_state_dict(ours.state_dict())  # ours into a bare model
    return dict(keys=keys, offset_after_forward=offset_after_forward, loaded_bare=loaded_bare,
                loaded_prefixed=loaded_prefixed, fresh=fresh.offset.tolist())


def _reducer(rank, world):
    model = mlp(100 + rank)
    red = Reducer(model)
    same = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.full_like(p, float(rank + 1))
    model[0].bias.grad = None if rank == 0 else model[0].bias.grad  # a missing grad is zeros
    model[-1].bias.grad = None  # no rank has one: it stays None
    red.reduce()
    tensors = [torch.full((3,), float(rank)), torch.full((2, 2), float(rank), dtype=torch.float64)]
    Reducer(tensors).reduce()
    half = mlp(0, dtype=torch.bfloat16)
    for p in half.parameters():
        p.grad = torch.full_like(p, float(rank + 1))
    calls = []
    real = dist.all_reduce
    dist.all_reduce = lambda *a, **k: (calls.append(1), real(*a, **k))[1]
    try:
        Reducer(half).reduce()
    finally:
        dist.all_reduce = real
    return dict(params=same, weight_grad=model[0].weight.grad.unique().tolist(),
                bias_grad=model[0].bias.grad.unique().tolist(),
                unused_grad_is_none=model[-1].bias.grad is None,
                list_values=[t.unique().tolist() for t in tensors],
                bf16_collectives=len(calls), bf16_grad=half[0].weight.grad.unique().tolist())


def _full_batch_step(ours, ref, step, rank, world):
    """One backward of the wrapped model on this rank's slice and of the reference on
    the whole batch; the max difference of their grads (params without grads skipped)."""
    x, y = data(step)
    zero(ours, True)
    zero(ref, True)
    loss_fn(ours(local(x, rank, world)), local(y, rank, world)).backward()
    loss_fn(ref(x), y).backward()
    pairs = [(a.grad, b.grad) for a, b in zip(ours.parameters(), ref.parameters()) if b.grad is not None]
    return max_diff(*zip(*pairs)), [a.grad is None for a, b in zip(ours.parameters(), ref.parameters())
                                    if b.grad is None]


def _refrozen(rank, world):
    """Params frozen at construction and unfrozen later (then frozen again) are
    reduced from the next forward on: Apex's needs_refresh, done automatically."""
    ours, ref = DistributedDataParallel(mlp(0), message_size=40), mlp(0)
    diffs, stale = [], []
    for step, trainable in enumerate([False, True, True, False]):
        for model in (ours.module, ref):
            model[0].weight.requires_grad_(trainable)
        diff, none_grads = _full_batch_step(ours, ref, step, rank, world)
        diffs.append(diff)
        stale.append(all(none_grads))
    ours.needs_refresh = True  # forced, as Apex allows: re-plans with the same params
    diffs.append(_full_batch_step(ours, ref, 4, rank, world)[0])
    return dict(diffs=diffs, frozen_grads_none=all(stale), refreshed=not ours.needs_refresh)


def _gan_discriminator(rank, world):
    """A GAN step: the discriminator, frozen whole, runs a forward for the generator's
    loss, then is unfrozen for its own step; once planned, nothing is re-planned."""
    disc = DistributedDataParallel(mlp(0), message_size=40)
    ref = mlp(0)
    plans = []
    diffs = []
    for step in range(3):
        x, y = data(step)
        for model in (disc.module, ref):
            model.requires_grad_(False)
        fake = local(x, rank, world).clone().requires_grad_()
        loss_fn(disc(fake), local(y, rank, world)).backward()  # the generator's loss: no D grads
        for model in (disc.module, ref):
            model.requires_grad_(True)
        diffs.append(_full_batch_step(disc, ref, step, rank, world)[0])
        plans.append(id(disc._grads.buckets))
    return dict(diffs=diffs, replans=len(set(plans)) - 1)


def _no_grad_forward_inside_no_sync(rank, world):
    """A no_grad forward (logging, an EMA teacher) inside no_sync() between a synced
    forward and its backward decides nothing: the backward still reduces."""
    ours, ref = DistributedDataParallel(mlp(0)), mlp(0)
    x, y = data(0)
    zero(ours, True)
    out = ours(local(x, rank, world))
    with ours.no_sync(), torch.no_grad():
        ours(local(x, rank, world))
    loss_fn(out, local(y, rank, world)).backward()
    loss_fn(ref(x), y).backward()
    return dict(diff=max_diff(grads(ours), grads(ref)))


def _disable_allreduce(rank, world):
    """Apex's disable_allreduce / enable_allreduce: the grads of the first backward
    stay local, the second backward reduces the sum of both."""
    ours, ref = DistributedDataParallel(mlp(0)), mlp(0)
    zero(ours, True)
    zero(ref, True)
    ours.disable_allreduce()
    for step in range(2):
        x, y = data(step)
        if step == 1:
            local_grads = rank_grads(ours.module, world)
            ours.enable_allreduce()
        loss_fn(ours(local(x, rank, world)), local(y, rank, world)).backward()
        loss_fn(ref(x), y).backward()
    return dict(local_differ=max_diff([local_grads[0]], [local_grads[1]]) > 1e-3,
                summed=max_diff(grads(ours), grads(ref)))


class ChildNamedModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.module = nn.Linear(2, 2)
        self.head = nn.Linear(2, 2)

    def forward(self, x):
        return self.head(self.module(x))


def _child_named_module(rank, world):
    """A wrapped model with a child called ``module``: its state dict round-trips
    through the wrapper, in our (bare) keys and in torch DDP's prefixed ones."""
    ours = DistributedDataParallel(ChildNamedModule())
    bare = ChildNamedModule()
    with torch.no_grad():
        for p in bare.parameters():
            p.fill_(2.0)
    report = ours.load_state_dict(bare.state_dict())
    bare_ok = all((p == 2.0).all().item() for p in ours.parameters())
    ours.load_state_dict({"module." + k: v * 0 + 3 for k, v in bare.state_dict().items()})
    prefixed_ok = all((p == 3.0).all().item() for p in ours.parameters())
    ours.load_state_dict(ours.state_dict())
    loose = ours.load_state_dict({"head.weight": bare.head.weight, "extra": torch.zeros(1)}, strict=False)
    return dict(keys=sorted(ours.state_dict()), clean=not report.missing_keys and not report.unexpected_keys,
                bare_ok=bare_ok, prefixed_ok=prefixed_ok, missing=sorted(loose.missing_keys),
                unexpected=loose.unexpected_keys)


def _flat_dist_call(rank, world):
    from core_ops.parallel.distributed import flat_dist_call
    ts = [torch.full((3,), float(rank + 1)), torch.full((2,), float(rank + 1), dtype=torch.float64)]
    flat_dist_call(ts, dist.all_reduce)  # averaged, as in Apex
    averaged = [t.tolist() for t in ts]
    bs = [torch.full((2,), float(rank + 5))]
    flat_dist_call(bs, dist.broadcast, (0,))
    return dict(averaged=averaged, broadcast=bs[0].tolist())


def _kept_grads(rank, world):
    """Grads kept across zero_grad(set_to_none=True) (gradient-similarity logging,
    PCGrad-style projections) still hold their step's values after the next backward,
    as with torch's DDP, although core_ops' grads are views of its buckets; grads
    zeroed in place keep reusing the buckets (no new buffers)."""
    model = DistributedDataParallel(mlp(0))
    x, y = data(0)
    loss_fn(model(local(x, rank, world)), local(y, rank, world)).backward()
    kept = [p.grad for p in model.parameters()]
    values = [g.clone() for g in kept]
    model.zero_grad(set_to_none=True)
    x, y = data(1)
    loss_fn(model(local(x, rank, world)), local(y, rank, world)).backward()
    intact = all(torch.equal(k, v) for k, v in zip(kept, values))
    changed = not all(torch.equal(p.grad, v) for p, v in zip(model.parameters(), values))
    del kept, values
    buffers = [b.buffer.data_ptr() for b in model._grads.buckets]
    for step in (2, 3):
        model.zero_grad(set_to_none=False)
        x, y = data(step)
        loss_fn(model(local(x, rank, world)), local(y, rank, world)).backward()
    reused = buffers == [b.buffer.data_ptr() for b in model._grads.buckets]
    return dict(intact=intact, changed=changed, reused=reused)


def suite(rank, world):
    return dict(
        fp32=_fp32(rank, world, delay=False),
        fp32_delay=_fp32(rank, world, delay=True),
        fp16=_half(rank, world, torch.float16, False),
        bf16=_half(rank, world, torch.bfloat16, False),
        bf16_fp32=_half(rank, world, torch.bfloat16, True),
        fp32_as_bf16=_compressed(rank, world, torch.bfloat16),
        fp32_as_fp16=_compressed(rank, world, torch.float16),
        fp64_as_fp32=_compressed(rank, world, torch.float32, torch.float64),
        mixed_dtypes=_mixed_dtypes(rank, world),
        no_sync_then_unused=_no_sync_then_unused(rank, world),
        failed_finish=_failed_finish_then_step(rank, world),
        no_sync=_no_sync(rank, world),
        no_sync_forward_decides=_no_sync_forward_decides(rank, world),
        unused=_unused(rank, world),
        overlap=_overlap(rank, world),
        scaling=_scaling(rank, world),
        state=_state_and_buffers(rank, world),
        reducer=_reducer(rank, world),
        refrozen=_refrozen(rank, world),
        gan=_gan_discriminator(rank, world),
        no_grad_forward=_no_grad_forward_inside_no_sync(rank, world),
        disable_allreduce=_disable_allreduce(rank, world),
        child_named_module=_child_named_module(rank, world),
        flat_dist_call=_flat_dist_call(rank, world),
        kept_grads=_kept_grads(rank, world),
    )
