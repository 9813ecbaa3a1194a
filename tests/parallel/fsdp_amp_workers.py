"""Rank functions for test_fsdp_amp.py: Apex's opt levels on models sharded by FSDP2
(Note [Opt levels on FSDP2] in core_ops/amp/fsdp.py), against the same training on
core_ops' DistributedDataParallel, with overflows, clipping and checkpoints."""

import os

import torch
import torch.nn.functional as F
from torch import nn

from core_ops import amp
from core_ops._sharded import local
from core_ops.optimizers import FusedAdam

STEPS = 6


def model(seed=0):
    torch.manual_seed(seed)
    blocks = [nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16), nn.LayerNorm(16)) for _ in range(2)]
    return nn.Sequential(*blocks, nn.Linear(16, 5))


def shard(m, **options):
    from torch.distributed.fsdp import fully_shard
    for block in list(m)[:-1]:
        fully_shard(block, **options)
    return fully_shard(m, **options)


def offload_of(net):
    """{(each unit's offload policy, whether FSDP2 keeps each of its params on the CPU)},
    read from FSDP2's param groups (torch's private state: what fully_shard took)."""
    groups = [m._get_fsdp_state()._fsdp_param_group for m in net.modules() if hasattr(m, "_get_fsdp_state")]
    return sorted({(type(g.offload_policy).__name__, all(fp.offload_to_cpu for fp in g.fsdp_params))
                   for g in groups if g is not None})


def cpu_offload():
    """FSDP2's CPUOffloadPolicy as a CPU-only machine takes it: pinning a tensor needs a
    CUDA driver (the default pin_memory=True raises "Found no NVIDIA driver" in
    fully_shard), and pinned memory serves only the copies to a GPU."""
    from torch.distributed.fsdp import CPUOffloadPolicy
    return CPUOffloadPolicy(pin_memory=False)


def batch(step, rank, world, size=8):
    """This rank's rows of the global batch of ``step``: the same ``size`` rows whatever
    the world size (2 or 4)."""
    g = torch.Generator().manual_seed(100 + step)
    x, y = torch.randn(size, 16, generator=g), torch.randn(size, 5, generator=g)
    rows = size // world
    return x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t.detach().clone()


def _state(opt):
    return [{k: _full(v) for k, v in opt.state[p].items()} for g in opt.param_groups for p in g["params"]]


def _train(net, opt, rank, world, steps, start=0):
    losses = []
    for i in range(start, start + steps):
        x, y = batch(i, rank, world)
        opt.zero_grad()
        loss = F.mse_loss(net(x).float(), y)
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses)


def _initialized(level, half, sharded, offload=False, **options):
    net = model()
    if sharded:
        net = shard(net, **({"offload_policy": cpu_offload()} if offload else {}))
    opt = FusedAdam(net.parameters(), lr=1e-2, weight_decay=0.01)
    net, opt = amp.initialize(net, opt, opt_level=level, half_dtype=half, verbosity=0, **options)
    return net, opt


def levels_against_ddp(rank, world):
    """Each level on FSDP2 against DDP, and on FSDP2 with CPUOffloadPolicy (the run the
    offload is compared with is the plain FSDP2 one)."""
    return _against_ddp(rank, world, ("O0", "O1", "O2", "O3"), offload=True)


def o2_against_ddp(rank, world):
    return _against_ddp(rank, world, ("O2",))


def edges(rank, world):
    """What a model sharded after initialize, one run before initialize, one with params
    outside every unit and one with BatchNorm beside other layers are told; BatchNorm
    apart; a policy given at fully_shard; a model built on the meta device."""
    errors = {}
    net = model()
    net, _ = amp.initialize(net, FusedAdam(net.parameters()), opt_level="O2", half_dtype=torch.bfloat16,
                            verbosity=0)
    shard(net)
    try:
        net(batch(0, rank, world)[0])
    except RuntimeError as e:
        errors["sharded_after"] = str(e)
    net = shard(model())
    net(batch(0, rank, world)[0])  # FSDP2 fixes its dtypes at this first forward
    try:
        amp.initialize(net, FusedAdam(net.parameters()), opt_level="O2", half_dtype=torch.bfloat16, verbosity=0)
    except RuntimeError as e:
        errors["ran_before"] = str(e)
    from torch.distributed.fsdp import fully_shard
    half_shard = model()
    fully_shard(half_shard[0])  # the root and the other blocks left whole
    try:
        amp.initialize(half_shard, FusedAdam(half_shard.parameters()), opt_level="O2", verbosity=0)
    except ValueError as e:
        errors["unsharded_param"] = str(e)
    early = model()
    early_opt = FusedAdam(early.parameters())  # built before the sharding
    try:
        amp.initialize(shard(early), early_opt, opt_level="O2", verbosity=0)
    except ValueError as e:
        errors["optimizer_before"] = str(e)
    mixed = fully_shard(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)))
    try:
        amp.initialize(mixed, FusedAdam(mixed.parameters()), opt_level="O2", half_dtype=torch.bfloat16, verbosity=0)
    except ValueError as e:
        errors["batchnorm"] = str(e)
    # The route it names: BatchNorm sharded on its own is gathered and run in float32.
    torch.manual_seed(0)
    apart = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    fully_shard(apart[1])
    fully_shard(apart)
    apart, opt = amp.initialize(apart, FusedAdam(apart.parameters()), opt_level="O2", half_dtype=torch.bfloat16,
                                verbosity=0)
    seen = []
    for m in apart:
        m.register_forward_hook(lambda m, i, o: seen.append((type(m).__name__, str(i[0].dtype), str(o.dtype))))
    loss = apart(torch.randn(8, 4)).float().square().mean()
    with amp.scale_loss(loss, opt) as scaled:
        scaled.backward()
    opt.step()
    errors["apart"] = seen
    errors["apart_running_mean"] = str(apart[1].running_mean.dtype)
    # A policy given at fully_shard is kept (here: grads reduced in bf16, half the bytes);
    # one gathering in another half dtype than the opt level's is refused.
    policy = amp.fsdp_policy("O2", torch.bfloat16, reduce_dtype=torch.bfloat16)
    kept = fully_shard(model(), mp_policy=policy)
    kept, opt = amp.initialize(kept, FusedAdam(kept.parameters()), opt_level="O2", half_dtype=torch.bfloat16,
                               verbosity=0)
    errors["kept_policy"] = kept._get_fsdp_state()._mp_policy
    other = fully_shard(model(), mp_policy=policy)
    try:
        amp.initialize(other, FusedAdam(other.parameters()), opt_level="O2", half_dtype=torch.float16, verbosity=0)
    except ValueError as e:
        errors["other_half"] = str(e)
    with torch.device("meta"):
        meta = model()
    shard(meta).to_empty(device="cpu")
    torch.manual_seed(0)
    for m in meta.modules():
        if hasattr(m, "reset_parameters"):
            m.reset_parameters()
    linears = [m for m in meta.modules() if isinstance(m, nn.Linear)]
    errors["meta_init"] = [(m.in_features, m.weight.full_tensor().abs().max().item(), m.weight.full_tensor().std().item())
                           for m in linears]
    meta, opt = amp.initialize(meta, FusedAdam(meta.parameters(), lr=1e-2), opt_level="O2",
                               half_dtype=torch.bfloat16, verbosity=0)
    errors["meta_losses"] = _train(meta, opt, rank, world, 1)  # a first step
    return errors


def _against_ddp(rank, world, levels, offload=False):
    """Each opt level on FSDP2 and on core_ops' DDP: losses, final params, and what
    each rank holds of the params and optimizer state at O2; with ``offload``, also on
    FSDP2 with CPUOffloadPolicy: losses, params, the units' offload policy and where
    the params, grads and optimizer state are."""
    from core_ops.parallel import DistributedDataParallel
    out = {}
    for level in levels:
        net, opt = _initialized(level, torch.bfloat16, sharded=True)
        out[level] = {"fsdp": _train(net, opt, rank, world, STEPS),
                      "fsdp_params": [_full(p).float() for p in net.parameters()]}
        if offload:
            net, opt = _initialized(level, torch.bfloat16, sharded=True, offload=True)
            out[level]["offload"] = _train(net, opt, rank, world, STEPS)
            out[level]["offload_params"] = [_full(p).float() for p in net.parameters()]
            out[level]["offload_policies"] = offload_of(net)
            out[level]["offload_devices"] = sorted({str(local(t).device) for p in net.parameters()
                                                    for t in (p, p.grad)} |
                                                   {str(local(v).device) for s in opt.state.values()
                                                    for v in s.values()})
            out[level]["offload_state"] = sorted({(k, type(v).__name__) for s in opt.state.values()
                                                  for k, v in s.items()})
        if level == "O2":
            out["o2_dtypes"] = sorted({str(p.dtype) for p in net.parameters()} |
                                      {str(p.grad.dtype) for p in net.parameters()})
            out["o2_local"] = sum(p.to_local().numel() for p in net.parameters())
            out["o2_state_local"] = sum(v.to_local().numel() for s in opt.state.values() for v in s.values()
                                        if hasattr(v, "to_local"))
            out["whole"] = sum(p.numel() for p in net.parameters())
            seen = []
            hook = net[0][0].register_forward_hook(lambda m, i, o: seen.append((str(i[0].dtype), str(o.dtype))))
            out["o2_out"] = str(net(batch(0, rank, world)[0]).dtype)
            hook.remove()
            out["o2_block_io"] = seen
        ddp_net, ddp_opt = _initialized(level, torch.bfloat16, sharded=False)
        # Grads reduced in float32, as fsdp_policy's default reduce-scatter does (DDP then
        # rounds the mean to the half params' grads; FSDP2 keeps it float32).
        ddp_net = DistributedDataParallel(ddp_net, allreduce_always_fp32=True)
        out[level]["ddp"] = _train(ddp_net, ddp_opt, rank, world, STEPS)
        masters = {id(p): m for p, m in getattr(ddp_opt._amp_stash, "pairs", [])}
        out[level]["ddp_params"] = [masters.get(id(p), p).detach().float().clone()
                                    for p in ddp_net.module.parameters()]
    return out


def overflow_and_clipping(rank, world):
    """AmpLoop at O2 fp16 on FSDP2 (the Lightning plugin's loop): an inf in rank 0's
    shard of one grad at step 2 only; every step clipped to a global norm of 0.05."""
    from core_ops.amp import AmpLoop
    loop = AmpLoop("O2", half_dtype=torch.float16)
    net = loop.prepare_model(shard(model()))
    opt = loop.attach(FusedAdam(net.parameters(), lr=1e-2))
    out = {"steps": []}
    for i in range(4):
        x, y = batch(i, rank, world)
        opt.zero_grad()
        loop.scale(F.mse_loss(net(x).float(), y)).backward()
        if i == 2 and rank == 0:
            next(net.parameters()).grad.to_local().view(-1)[0] = float("inf")
        loop.unscale_(opt)
        true_norm = torch.linalg.vector_norm(torch.stack([p.grad.full_tensor().norm() for p in net.parameters()]))
        norm = loop.clip_grad_norm_(opt, 0.05)
        clipped = torch.linalg.vector_norm(torch.stack([p.grad.full_tensor().norm() for p in net.parameters()]))
        before = ([_full(p) for p in net.parameters()], _state(opt))
        loop.step(opt)
        loop.update()
        after = ([_full(p) for p in net.parameters()], _state(opt))
        out["steps"].append(dict(norm=norm, true_norm=true_norm, clipped=clipped, scale=loop.loss_scale,
                                 skipped=loop.step_was_skipped(opt),
                                 params_same=all(torch.equal(a, b) for a, b in zip(before[0], after[0])),
                                 state_same=all(torch.equal(a[k], b[k]) for a, b in zip(before[1], after[1])
                                                for k in a)))
    return out


def _dcp_state(net, opt, full):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    options = StateDictOptions(full_state_dict=full, cpu_offload=full)
    model_sd, optim_sd = get_state_dict(net, opt, options=options)
    return {"model": model_sd, "optim": optim_sd, "amp": amp.state_dict()}


def _load(net, opt, saved, full):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict
    set_state_dict(net, opt, model_state_dict=saved["model"], optim_state_dict=saved["optim"],
                   options=StateDictOptions(full_state_dict=full, broadcast_from_rank0=False))
    amp.load_state_dict(saved["amp"])


def resume(rank, world):
    """O2 fp16 (a dynamic loss scale to save) for STEPS steps without a stop, then
    stopped after 3 and resumed from a sharded (torch.distributed.checkpoint) and from
    a full checkpoint: losses, params and optimizer state at the end. The full one is
    also written to $FSDP_FULL_CHECKPOINT for resume_on_other_world."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    where = os.environ["FSDP_CHECKPOINT_DIR"]
    out = {}
    net, opt = _initialized("O2", torch.float16, sharded=True)
    out["straight"] = (_train(net, opt, rank, world, STEPS), [_full(p) for p in net.parameters()], _state(opt),
                       amp.state_dict())
    for form in ("sharded", "full"):
        net, opt = _initialized("O2", torch.float16, sharded=True)
        first = _train(net, opt, rank, world, 3)
        saved = _dcp_state(net, opt, full=form == "full")
        if form == "sharded":
            dcp.save(saved, checkpoint_id=os.path.join(where, "dcp"))
        elif rank == 0:
            torch.save(saved, os.path.join(where, "full.pt"))
            out["full_dtypes"] = sorted({str(v.dtype) for v in saved["model"].values()})
            out["full_types"] = sorted({type(v).__name__ for v in saved["model"].values()})
        dist.barrier()
        net, opt = _initialized("O2", torch.float16, sharded=True)
        if form == "sharded":
            loaded = _dcp_state(net, opt, full=False)
            dcp.load(loaded, checkpoint_id=os.path.join(where, "dcp"))
        else:
            loaded = torch.load(os.path.join(where, "full.pt"), weights_only=False)
        _load(net, opt, loaded, full=form == "full")
        rest = _train(net, opt, rank, world, STEPS - 3, start=3)
        out[form] = (torch.cat([first, rest]), [_full(p) for p in net.parameters()], _state(opt), amp.state_dict())
    return out


def resume_on_other_world(rank, world):
    """The full checkpoint of ``resume`` (another world size) loaded into a model
    sharded over this world, and into a plain model: what they hold, then one step."""
    path = os.path.join(os.environ["FSDP_CHECKPOINT_DIR"], "full.pt")
    saved = torch.load(path, weights_only=False)
    net, opt = _initialized("O2", torch.float16, sharded=True)
    _load(net, opt, torch.load(path, weights_only=False), full=True)  # it shards the dict given in place
    names = [n for n, _ in net.named_parameters()]
    params_equal = all(torch.equal(_full(p), saved["model"][n]) for n, p in net.named_parameters())
    plain = model(seed=1)
    plain.load_state_dict(saved["model"])
    plain_equal = all(torch.equal(p.detach(), saved["model"][n]) for n, p in plain.named_parameters())
    state = _state(opt)
    saved_state = [saved["optim"]["state"][n] for n in names]
    state_equal = all(torch.equal(s[k].cpu(), torch.as_tensor(t[k]).cpu()) for s, t in zip(state, saved_state) for k in t)
    scale = amp.state_dict()["loss_scaler0"]["loss_scale"]
    loss = _train(net, opt, rank, world, 1, start=3)
    return dict(params_equal=params_equal, plain_equal=plain_equal, state_equal=state_equal, scale=scale,
                saved_scale=saved["amp"]["loss_scaler0"]["loss_scale"], loss=loss)
