"""SyncBatchNorm forward + backward per rank, against torch in the same run.

    python bench/bench_syncbn.py [--repeats 30] [--json out.json]      # CPU: 2 gloo ranks
    python bench/bench_syncbn.py --device cuda [--ranks N]               # NCCL, a rank per GPU

CPU: 2 gloo ranks x 1 thread, a (32, 64, 32, 32) fp32 input per rank, against a local
torch.nn.BatchNorm2d (torch has no CPU SyncBatchNorm). Target: <= 1.5x.
CUDA: a (64, 64, 56, 56) fp32 input per rank, against torch.nn.SyncBatchNorm on the
same group (every GPU unless --ranks; on one rank torch's runs F.batch_norm, as it has
nothing to sync). Target: <= 1.0x.

Before timing, each rank checks SyncBatchNorm against BatchNorm2d on the concatenated
global batch. Each timed call starts after an untimed barrier; rank 0 reports.
"""

import torch
import torch.distributed as dist
from torch import nn

import harness
from core_ops.parallel import SyncBatchNorm

# device type: (input shape per rank, baseline class, its name in the table, target ratio)
CASES = {
    "cpu": ((32, 64, 32, 32), nn.BatchNorm2d, "local nn.BatchNorm2d", 1.5),
    "cuda": ((64, 64, 56, 56), nn.SyncBatchNorm, "nn.SyncBatchNorm", 1.0),
}


def fwd_bwd(module, x, dy):
    def step():
        x.grad = None
        module.zero_grad()
        module(x).backward(dy)
    return step


def check(rank, world, channels, device):
    g = torch.Generator().manual_seed(0)
    x = torch.randn((world * 4, channels, 8, 8), generator=g).to(device)
    ref, ours = nn.BatchNorm2d(channels).to(device), SyncBatchNorm(channels).to(device)
    mine = slice(rank * 4, (rank + 1) * 4)
    tol = 1e-5 if device == "cpu" else 1e-4  # cuDNN sums in its own order
    torch.testing.assert_close(ours(x[mine]), ref(x)[mine], rtol=tol, atol=tol)


def worker(rank, args):
    shape, baseline, baseline_name, target = CASES[args.device]
    device = f"cuda:{rank}" if args.device == "cuda" else "cpu"
    world = dist.get_world_size()
    check(rank, world, shape[1], device)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(shape, generator=g).to(device).requires_grad_()
    dy = torch.randn(shape, generator=g).to(device)
    base = fwd_bwd(baseline(shape[1]).to(device), x, dy)
    core = fwd_bwd(SyncBatchNorm(shape[1]).to(device), x, dy)
    bt, ct = harness.time_ab(base, core, device, args.repeats, args.warmup, before=dist.barrier)
    rows = [harness.row(f"fwd+bwd {tuple(shape)} fp32 per rank, {world} rank{'s' if world > 1 else ''}",
                        baseline_name, bt, ct, target)]
    if rank == 0:
        harness.report(rows, args)


def main():
    p = harness.parser(__doc__.splitlines()[0], repeats=30)
    p.add_argument("--ranks", type=int, help="CUDA: processes, one a GPU (default: every GPU)")
    args = p.parse_args()
    harness.setup(args)
    if args.device == "cpu":
        harness.run_ranks(worker, args, world_size=2, timeout_s=120)
    else:
        ranks = args.ranks or torch.cuda.device_count()
        if not 1 <= ranks <= torch.cuda.device_count():
            raise SystemExit(f"--ranks {ranks}: expected 1 to {torch.cuda.device_count()} (one rank a GPU)")
        harness.run_ranks(worker, args, world_size=ranks, timeout_s=120, backend="nccl")


if __name__ == "__main__":
    main()
