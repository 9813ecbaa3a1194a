"""FusedSGD, FusedAdagrad, FusedLAMB and FusedNovoGrad, in the same run (interleaved):
SGD and Adagrad against torch's best (fused or foreach, picked at run time); LAMB and
NovoGrad, which torch lacks, as effective bandwidth against this machine's copy
bandwidth (target >= 70%).

    python bench/bench_optimizers.py [--device cpu|cuda] [--repeats 20] [--numel 20000000]
"""

import torch

import harness
from core_ops.optimizers import FusedAdagrad, FusedLAMB, FusedNovoGrad, FusedSGD

# Bytes each step must move per fp32 element (reads + writes), by the algorithm:
#   LAMB: stage 1 reads p g m v, writes m v u; norms read p u; stage 2 reads p u, writes p.
#   NovoGrad: the grad-norm pass reads g; the update reads p g m, writes p m.
BYTES_PER_ELEMENT = {"FusedLAMB": 48, "FusedNovoGrad": 24}


def make(args, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = args.numel // args.tensors
    ps = [torch.randn(n, generator=g).to(args.device).requires_grad_() for _ in range(args.tensors)]
    for p in ps:
        p.grad = (torch.randn(n, generator=g) * 1e-2).to(args.device)
    return ps


def fastest_torch(args, cls, kw):
    """torch's strongest variant of ``cls`` on this device, by a short trial."""
    best = None
    for variant in (dict(fused=True), dict(foreach=True)):
        try:
            opt = cls(make(args), **kw, **variant)
            opt.step()
        except (RuntimeError, TypeError):
            continue
        t = harness.summarize(harness.time_fn(opt.step, args.device, repeats=5, warmup=1))[0]
        if best is None or t < best[0]:
            best = (t, opt, variant)
    return best[1], best[2]


def main():
    args = harness.parser(__doc__.splitlines()[0], repeats=20).parse_args()
    harness.setup(args)
    rows = []
    for ours, theirs, kw, target in [
        (FusedSGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=1e-4), 1.0),
        (FusedAdagrad, torch.optim.Adagrad, dict(lr=0.01, weight_decay=1e-4), None),
    ]:
        base, variant = fastest_torch(args, theirs, kw)
        core = ours(make(args), **kw)
        core.step()
        bt, ct = harness.time_ab(base.step, core.step, args.device, args.repeats, args.warmup)
        name = f"torch.optim.{theirs.__name__}({', '.join(f'{k}=True' for k in variant)})"
        rows.append(harness.row(ours.__name__, name, bt, ct, target))
    harness.compare(rows)

    copy_gbps = harness.copy_bandwidth(args.device)
    print(f"\ncopy bandwidth (read + write): {copy_gbps:.1f} GB/s; target >= 70% of it\n")
    print("| optimizer | median ms | GB/s | % of copy |\n|---|---:|---:|---:|")
    for cls, kw in [(FusedLAMB, dict(lr=1e-3)), (FusedNovoGrad, dict(lr=1e-3))]:
        opt = cls(make(args), **kw)
        med, _ = harness.summarize(harness.time_fn(opt.step, args.device, args.repeats, args.warmup))
        gbps = harness.gbps(BYTES_PER_ELEMENT[cls.__name__] * args.numel, med)
        print(f"| {cls.__name__} | {med:.2f} | {gbps:.1f} | {100 * gbps / copy_gbps:.0f}% |")


if __name__ == "__main__":
    main()
