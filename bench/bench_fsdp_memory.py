"""Memory per rank of Apex's O2 on FSDP2 (core_ops.amp on ``fully_shard``) against O2
on core_ops' DistributedDataParallel, with 2 and 4 gloo ranks on CPU: a stack of
transformer-sized MLP blocks (~25M params), FusedAdam, 3 training steps in bf16.

    python bench/bench_fsdp_memory.py [--worlds 2 4] [--blocks 6] [--width 1024]

Per rank, after the third step: the bytes of every tensor training keeps (params,
grads, fp32 masters, optimizer state; each storage once) and the peak resident memory
the run added over the process's start (after ``import torch`` and one tiny O2 step,
which loads the kernels). Each configuration
runs in fresh processes, so each peak is its own. DDP's half params and masters are
whole on every rank; FSDP2's float32 shards are the masters, 1/N of the model each.
``fsdp-meta`` builds the model on the meta device and initializes only each rank's
shards (``to_empty`` + ``reset_parameters``), FSDP2's way for models that do not fit
whole.
"""

import argparse
import contextlib
import resource
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch import nn

import harness

KINDS = ("ddp", "fsdp", "fsdp-meta")


def _model(args):
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(args.width, 4 * args.width), nn.GELU(),
                            nn.Linear(4 * args.width, args.width), nn.LayerNorm(args.width))
              for _ in range(args.blocks)]
    return nn.Sequential(*blocks)


def _storage_bytes(tensors):
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        t = t.to_local() if hasattr(t, "to_local") else t
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def _held(model, opt):
    tensors = list(model.parameters()) + [p.grad for p in model.parameters()]
    for group in opt.param_groups:
        tensors += group["params"] + [p.grad for p in group["params"]]
    tensors += [v for state in opt.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    return _storage_bytes(tensors)


def _warm_up():
    """One tiny O2 step, so that the libraries' first-use memory (the native kernels,
    oneDNN's bf16 set-up) is in the baseline, not in the configuration's growth."""
    from core_ops import amp
    from core_ops.optimizers import FusedAdam
    tiny = torch.nn.Linear(64, 64)
    tiny, opt = amp.initialize(tiny, FusedAdam(tiny.parameters()), opt_level="O2", half_dtype=torch.bfloat16,
                               verbosity=0)
    with amp.scale_loss(tiny(torch.randn(8, 64)).float().sum(), opt) as scaled:
        scaled.backward()
    opt.step()


def worker(rank, args):
    import torch.distributed as dist
    from core_ops import amp
    from core_ops.optimizers import FusedAdam
    from core_ops.parallel import DistributedDataParallel
    _warm_up()
    start_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    meta = args.kind == "fsdp-meta"  # built on the meta device, each rank making only its shards
    with torch.device("meta") if meta else contextlib.nullcontext():
        model = _model(args)
    if args.kind.startswith("fsdp"):
        from torch.distributed.fsdp import fully_shard
        for block in model:
            fully_shard(block)
        fully_shard(model)
    if meta:
        model.to_empty(device="cpu")
        for module in model.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
    opt = FusedAdam(model.parameters(), lr=1e-3)
    model, opt = amp.initialize(model, opt, opt_level="O2", half_dtype=torch.bfloat16, verbosity=0)
    net = DistributedDataParallel(model) if args.kind == "ddp" else model
    g = torch.Generator().manual_seed(rank)
    for _ in range(3):
        x = torch.randn(args.batch, args.width, generator=g)
        opt.zero_grad()
        with amp.scale_loss(F.mse_loss(net(x).float(), x), opt) as scaled:
            scaled.backward()
        opt.step()
    held = _held(model, opt)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start_kib
    rows = [None] * dist.get_world_size()
    dist.all_gather_object(rows, (held, peak * 1024))
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        held_max = max(h for h, _ in rows)
        peak_max = max(p for _, p in rows)
        print(f"RESULT {args.kind} {dist.get_world_size()} {params} {held_max} {peak_max}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    p.add_argument("--blocks", type=int, default=6)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--kind", choices=KINDS, help=argparse.SUPPRESS)  # a child's
    p.add_argument("--world", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.kind:  # a child: one configuration
        harness.run_ranks(worker, args, world_size=args.world)
        return
    results = {}
    for world in args.worlds:
        for kind in KINDS:
            cmd = [sys.executable, __file__, "--kind", kind, "--blocks", str(args.blocks), "--width",
                   str(args.width), "--batch", str(args.batch), "--threads", str(args.threads)]
            out = subprocess.run(cmd + ["--world", str(world)], capture_output=True, text=True)
            line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")), None)
            if line is None:
                raise SystemExit(f"{kind} on {world} ranks failed:\n{out.stderr[-3000:]}")
            _, _, _, params, held, peak = line.split()
            results[(kind, world)] = (int(params), int(held), int(peak))
    mib = 2.0**20
    params = next(iter(results.values()))[0]
    print(f"O2 bf16, FusedAdam, {params / 1e6:.1f}M params; per rank (the largest rank's):")
    print(f"{'ranks':>5} {'layout':>9} {'held MiB':>9} {'vs DDP':>7} {'peak MiB':>9} {'vs DDP':>7}")
    for world in args.worlds:
        _, ddp_held, ddp_peak = results[("ddp", world)]
        for kind in KINDS:
            _, held, peak = results[(kind, world)]
            print(f"{world:>5} {kind:>9} {held / mib:>9.1f} {held / ddp_held:>7.2f} {peak / mib:>9.1f} "
                  f"{peak / ddp_peak:>7.2f}")


if __name__ == "__main__":
    main()
