"""DistributedDataParallel step time (forward + backward + gradient allreduce) on 2 gloo
ranks x 1 thread, an MLP of ~25M params, core_ops against torch's DDP with
gradient_as_bucket_view=True, interleaved in the same run; then bf16 gradients
allreduced in bf16 against torch's DDP on the fp32 model, two ways: the fp32 model
with allreduce_dtype=torch.bfloat16 (grads rounded to bf16 for the wire, half the
bytes), and a bf16 model (its compute in bf16 too).

    python bench/bench_ddp.py [--repeats 15] [--batch 32] [--json out.json]

Both sides' grads are checked against each other (and the ranks against each other)
before anything is timed. Each timed step starts after a barrier (untimed), so a
rank's time is its own step, not its wait for the other; rank 0 reports.
"""

import torch
import torch.distributed as dist
from torch import nn

import harness
from core_ops.parallel import DistributedDataParallel

WIDTHS = [1024, 3072, 3072, 3072, 1024]  # 25.2M params


def mlp(dtype=torch.float32):
    torch.manual_seed(0)
    layers = []
    for i, (a, b) in enumerate(zip(WIDTHS, WIDTHS[1:])):
        layers += [nn.Linear(a, b)] + ([nn.ReLU()] if i < len(WIDTHS) - 2 else [])
    return nn.Sequential(*layers).to(dtype)


def step_fn(model, x, y):
    def step():
        model.zero_grad()  # set_to_none, torch's default: both sides copy grads into buckets
        nn.functional.mse_loss(model(x).float(), y).backward()
    return step


def check(ours, theirs, rank, rtol):
    g_ours = torch.cat([p.grad.float().flatten() for p in ours.parameters()])
    g_theirs = torch.cat([p.grad.float().flatten() for p in theirs.parameters()])
    torch.testing.assert_close(g_ours, g_theirs, rtol=rtol, atol=rtol * g_theirs.abs().max().item())
    other = g_ours.clone()
    dist.broadcast(other, 0)
    assert torch.equal(other, g_ours), f"rank {rank} grads differ from rank 0's"


def ours_ddp(args, dtype, allreduce_dtype=None):
    return DistributedDataParallel(mlp(dtype), message_size=args.message_size,
                                   allreduce_dtype=allreduce_dtype)


def torch_compressed():
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook
    model = nn.parallel.DistributedDataParallel(mlp(), gradient_as_bucket_view=True)
    model.register_comm_hook(None, bf16_compress_hook)
    return model


def worker(rank, args):
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(args.batch, WIDTHS[0], generator=g), torch.randn(args.batch, WIDTHS[-1], generator=g)
    barrier = dist.barrier
    theirs = nn.parallel.DistributedDataParallel(mlp(), gradient_as_bucket_view=True)
    base = step_fn(theirs, x, y)
    rows = []
    # (case, model, its dtype, rtol of its grads against torch's, target)
    cases = [("fp32", lambda: ours_ddp(args, torch.float32), torch.float32, 1e-5, 1.0)]
    if not args.skip_bf16:
        # bf16 keeps 8 mantissa bits: each grad rounded once, the sum once: 2 * 2^-8.
        cases += [
            ("fp32 model, grads reduced in bf16 (allreduce_dtype)",
             lambda: ours_ddp(args, torch.float32, torch.bfloat16), torch.float32, 1e-2, 0.75),
            ("context: torch DDP + bf16_compress_hook", torch_compressed, torch.float32, 1e-2, None),
            ("bf16 model, grads reduced in bf16", lambda: ours_ddp(args, torch.bfloat16),
             torch.bfloat16, None, 0.75)]
    for case, make, dtype, rtol, target in cases:
        ours = make()
        core = step_fn(ours, x.to(dtype), y)
        for _ in range(2):  # the first step fixes our bucket layout
            base()
            core()
        if rtol is not None:  # the bf16 model's grads come from other (bf16) weights
            check(ours, theirs, rank, rtol)
        bt, ct = harness.time_ab(base, core, "cpu", args.repeats, args.warmup, before=barrier)
        params = sum(p.numel() for p in ours.parameters())
        rows.append(harness.row(f"DDP step, {params / 1e6:.1f}M params, {case}",
                                "torch DDP fp32 (gradient_as_bucket_view=True)", bt, ct, target,
                                buckets=len(getattr(ours, "_buckets", None) or [])))
        del ours
    if rank == 0:
        harness.report(rows, args)


def main():
    p = harness.parser(__doc__.splitlines()[0], repeats=15)
    p.add_argument("--batch", type=int, default=8, help="samples per rank")
    p.add_argument("--message-size", type=int, default=10_000_000,
                   help="core_ops DDP bucket size in elements (Apex's default 1e7)")
    p.add_argument("--skip-bf16", action="store_true", help="only the fp32 comparison")
    args = p.parse_args()
    if args.device != "cpu":
        raise SystemExit("bench_ddp runs 2 gloo ranks on CPU")
    harness.run_ranks(worker, args)


if __name__ == "__main__":
    main()
