"""SyncBatchNorm forward + backward on 2 gloo ranks x 1 thread, a (32, 64, 32, 32) fp32
input per rank, against local torch.nn.BatchNorm2d forward + backward in the same run
(torch has no CPU SyncBatchNorm to compare with). Target: <= 1.5x.

    python bench/bench_syncbn.py [--repeats 30] [--json out.json]

Before timing, each rank checks SyncBatchNorm against BatchNorm2d on the concatenated
global batch. Each timed call starts after an untimed barrier; rank 0 reports.
"""

import torch
import torch.distributed as dist
from torch import nn

import harness
from core_ops.parallel import SyncBatchNorm

SHAPE = (32, 64, 32, 32)


def fwd_bwd(module, x, dy):
    def step():
        x.grad = None
        module.zero_grad()
        module(x).backward(dy)
    return step


def check(rank):
    g = torch.Generator().manual_seed(0)
    x = torch.randn((2 * 4,) + SHAPE[1:], generator=g)
    ref, ours = nn.BatchNorm2d(SHAPE[1]), SyncBatchNorm(SHAPE[1])
    y = ours(x[rank * 4:(rank + 1) * 4])
    torch.testing.assert_close(y, ref(x)[rank * 4:(rank + 1) * 4], rtol=1e-5, atol=1e-5)


def worker(rank, args):
    check(rank)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(SHAPE, generator=g).requires_grad_()
    dy = torch.randn(SHAPE, generator=g)
    base = fwd_bwd(nn.BatchNorm2d(SHAPE[1]), x, dy)
    core = fwd_bwd(SyncBatchNorm(SHAPE[1]), x, dy)
    bt, ct = harness.time_ab(base, core, "cpu", args.repeats, args.warmup, before=dist.barrier)
    rows = [harness.row(f"fwd+bwd {tuple(SHAPE)} fp32 per rank, 2 ranks", "local nn.BatchNorm2d",
                        bt, ct, 1.5)]
    if rank == 0:
        harness.report(rows, args)


def main():
    args = harness.parser(__doc__.splitlines()[0], repeats=30).parse_args()
    if args.device != "cpu":
        raise SystemExit("bench_syncbn runs 2 gloo ranks on CPU; tests/gpu/run.sh times CUDA")
    harness.run_gloo_ranks(worker, args, timeout_s=120)


if __name__ == "__main__":
    main()
