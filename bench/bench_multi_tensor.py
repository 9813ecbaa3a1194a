"""core_ops multi-tensor ops vs the strongest PyTorch baseline, in the same run.

    python bench/bench_multi_tensor.py [--device cpu|cuda] [--repeats 30]
        [--numel 20000000] [--tensors 200] [--threads N]
        [--plot ratios.png] [--json results.json]

Every case first checks that core_ops and its baseline agree (values and found_inf),
so no timing is ever of a wrong answer; then both are timed interleaved (ABAB...).
"""

import torch
from torch.testing import assert_close

import core_ops
import harness


def make_tensors(numel, count, dtype, device, seed=0):
    """``count`` tensors holding ``numel`` N(0, 1) elements in all, sizes within one."""
    g = torch.Generator().manual_seed(seed)
    sizes = [numel // count + (i < numel % count) for i in range(count)]
    return [torch.randn(s, generator=g).to(device=device, dtype=dtype) for s in sizes]


def clone(ts):
    return [t.clone() for t in ts]


def nbytes(ts):
    return sum(t.numel() * t.element_size() for t in ts)


class Alternating:
    """Hands out inv_scale 2.0, then 0.5, then 2.0...: the in-place unscale runs a
    hundred-odd times on the same data, and a fixed inv_scale would walk it towards
    inf (>1) or into subnormals and 0 (<1); subnormal math is many times slower on
    x86, so the timing would drift too. Powers of two are exact in fp32 and bf16, so
    the data is bit-identical after every pair of calls. (1.0 would be simplest, but a
    kernel may special-case it: PyTorch's unscale branches on it.)"""

    def __init__(self, device):
        self.scales = [torch.full((1,), s, device=device) for s in (2.0, 0.5)]
        self.i = 0

    def __call__(self):
        self.i ^= 1
        return self.scales[self.i]


def torch_has_amp_unscale(device, dtype):
    """Whether torch's fused unscale + check takes ``dtype`` on ``device``: CUDA's has
    no bfloat16 kernel (torch 2.11 and 2.14), the CPU's has."""
    try:
        torch._amp_foreach_non_finite_check_and_unscale_(
            [torch.ones(2, dtype=dtype, device=device)], torch.zeros(1, device=device),
            torch.ones(1, device=device))
    except (NotImplementedError, RuntimeError):
        return False
    return True


def unscale_baseline(device, dtype):
    """(name, fn(ts, found_inf, inv_scale)): torch's fused unscale where it takes the
    dtype, else what a user writes instead: a foreach multiply, then the largest
    |value| per tensor (inf or nan wherever a value is) into the flag."""
    if torch_has_amp_unscale(device, dtype):
        return "_amp_foreach_non_finite_check_and_unscale_", torch._amp_foreach_non_finite_check_and_unscale_

    def foreach_unscale(ts, found_inf, inv):
        torch._foreach_mul_(ts, inv.reshape(()))
        peak = torch.stack(torch._foreach_norm(ts, float("inf"))).max()
        found_inf.copy_(torch.maximum(found_inf, (~torch.isfinite(peak)).float().reshape(1)))

    return "_foreach_mul_ + isfinite(_foreach_norm(inf))", foreach_unscale


def foreach_global_norm(ts):
    # With no dtype, the norm of a bf16 list comes back in bf16 (accumulated in fp32
    # inside); dtype=torch.float32 is ~3x slower on CPU, so the fast form is the
    # stronger baseline, at bf16 precision.
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(ts)))


def tolerances(dtype):
    # fp32: one rounding per element vs another order of summation over 20M squares.
    # bf16: the baseline rounds each per-tensor norm and the total to bf16 (2^-8).
    return dict(rtol=1e-5, atol=0) if dtype == torch.float32 else dict(rtol=1e-2, atol=0)


def check_flags(base_flag, core_flag, expect):
    assert base_flag.item() == core_flag.item() == expect, (base_flag, core_flag, expect)


def twin_inputs(args, dtype):
    """Equal tensors and zeroed flags for the baseline and core_ops, which each write."""
    base_ts = make_tensors(args.numel, args.tensors, dtype, args.device)
    return base_ts, clone(base_ts), torch.zeros(1, device=args.device), torch.zeros(1, device=args.device)


def case_unscale(args, dtype):
    """In-place unscale with the inf/nan check."""
    base_ts, core_ts, base_flag, core_flag = twin_inputs(args, dtype)
    base_name, unscale = unscale_baseline(args.device, dtype)

    def base(inv):
        unscale(base_ts, base_flag, inv)

    def core(inv):
        core_ops.multi_tensor_scale(core_ts, core_ts, inv, core_flag)

    # Multiplying by a power of two is exact, so the results must match bit for bit;
    # then one inf in one tensor must set both flags.
    half = torch.full((1,), 0.5, device=args.device)
    base(half), core(half)
    assert_close(core_ts, base_ts, rtol=0, atol=0)
    check_flags(base_flag, core_flag, 0)
    for ts in (base_ts, core_ts):
        ts[args.tensors // 2][7] = float("inf")
    base(half), core(half)
    check_flags(base_flag, core_flag, 1)
    assert_close(core_ts, base_ts, rtol=0, atol=0)
    for ts in (base_ts, core_ts):  # back to finite data for timing
        ts[args.tensors // 2][7] = 1.0
    base_flag.zero_(), core_flag.zero_()

    bi, ci = Alternating(args.device), Alternating(args.device)
    return base_name, lambda: base(bi()), lambda: core(ci()), 2 * nbytes(core_ts)


def case_l2norm(args, dtype):
    """Global L2 norm (read only, so both sides can share the data)."""
    ts = make_tensors(args.numel, args.tensors, dtype, args.device)
    assert_close(core_ops.multi_tensor_l2norm(ts)[0], foreach_global_norm(ts).float(),
                 **tolerances(dtype))
    return ("vector_norm(stack(_foreach_norm))", lambda: foreach_global_norm(ts),
            lambda: core_ops.multi_tensor_l2norm(ts), nbytes(ts))


def case_check_finite(args, dtype):
    """The read-only overflow check. torch has no read-only one; its fastest flag is
    the unscale op with inv_scale 1, which leaves the values as they are."""
    ts = make_tensors(args.numel, args.tensors, dtype, args.device)
    one = torch.ones(1, device=args.device)
    base_flag, core_flag = torch.zeros(1, device=args.device), torch.zeros(1, device=args.device)
    base_name, unscale = unscale_baseline(args.device, dtype)

    def base():
        unscale(ts, base_flag, one)

    def core():
        core_ops.multi_tensor_check_finite(ts, core_flag)

    base(), core()
    check_flags(base_flag, core_flag, 0)
    ts[args.tensors // 2][7] = float("nan")
    base(), core()
    check_flags(base_flag, core_flag, 1)
    ts[args.tensors // 2][7] = 1.0
    base_flag.zero_(), core_flag.zero_()
    return f"{base_name} (inv_scale=1)", base, core, nbytes(ts)


def case_unscale_l2norm(args, dtype):
    """Unscale in place, check inf/nan and take the norm of the unscaled values."""
    base_ts, core_ts, base_flag, core_flag = twin_inputs(args, dtype)

    base_name, unscale = unscale_baseline(args.device, dtype)

    def base(inv):
        unscale(base_ts, base_flag, inv)
        return foreach_global_norm(base_ts)

    def core(inv):
        return core_ops.multi_tensor_unscale_l2norm(core_ts, inv, core_flag)[0]

    half = torch.full((1,), 0.5, device=args.device)
    base_norm, core_norm = base(half), core(half)
    assert_close(core_ts, base_ts, rtol=0, atol=0)
    assert_close(core_norm, base_norm.float(), **tolerances(dtype))
    check_flags(base_flag, core_flag, 0)

    bi, ci = Alternating(args.device), Alternating(args.device)
    return f"{base_name} + foreach norm", lambda: base(bi()), lambda: core(ci()), 2 * nbytes(core_ts)


def axpby_baselines(xs, ys, out, a, b):
    """PyTorch ways to write a*x + b*y into ``out``, without an inf/nan check (which
    core_ops does on top). The fastest differs by device: on CPU the foreach ops are
    per-tensor loops anyway and each extra pass over memory costs, on CUDA fewer
    launches win; so the fastest one is picked at run time."""

    def foreach_copy_mul_add():
        torch._foreach_copy_(out, xs)
        torch._foreach_mul_(out, a)
        torch._foreach_add_(out, ys, alpha=b)

    def foreach_mul_add_copy():
        tmp = torch._foreach_mul(xs, a)
        torch._foreach_add_(tmp, ys, alpha=b)
        torch._foreach_copy_(out, tmp)

    def loop_mul_out_add():
        for x, y, o in zip(xs, ys, out):
            torch.mul(x, a, out=o)
            o.add_(y, alpha=b)

    return dict(foreach_copy_mul_add=foreach_copy_mul_add,
                foreach_mul_add_copy=foreach_mul_add_copy,
                loop_mul_out_add=loop_mul_out_add)


def case_axpby(args, dtype):
    xs = make_tensors(args.numel, args.tensors, dtype, args.device, seed=1)
    ys = make_tensors(args.numel, args.tensors, dtype, args.device, seed=2)
    base_out = [torch.empty_like(x) for x in xs]
    core_out = [torch.empty_like(x) for x in xs]
    a, b = 2.0, -0.5
    core_flag = torch.zeros(1, device=args.device)

    def core():
        core_ops.multi_tensor_axpby(xs, ys, core_out, a, b, core_flag)

    core()
    assert core_flag.item() == 0
    candidates = axpby_baselines(xs, ys, base_out, a, b)
    for fn in candidates.values():
        torch._foreach_zero_(base_out)  # so a candidate that writes nothing fails
        fn()
        # The kernel may fuse a*x + b*y into one FMA; torch rounds a*x first: 1 ulp.
        assert_close(core_out, base_out, rtol=1.3e-6, atol=1e-5)
    med = {name: harness.summarize(harness.time_fn(fn, args.device, repeats=5, warmup=1))[0]
           for name, fn in candidates.items()}
    name = min(med, key=med.get)
    print("axpby baselines (median ms): "
          + ", ".join(f"{k} {v:.2f}" for k, v in med.items()) + f" -> {name}")
    return name, candidates[name], core, 3 * nbytes(xs)


# (label, case, dtype, target ratio core_ops / baseline or None)
CASES = [
    ("unscale fp32", case_unscale, torch.float32, 1.0),
    ("l2norm fp32", case_l2norm, torch.float32, 0.5),
    ("check_finite fp32", case_check_finite, torch.float32, None),
    ("unscale+l2norm fp32", case_unscale_l2norm, torch.float32, None),
    ("axpby fp32", case_axpby, torch.float32, None),
    ("unscale bf16", case_unscale, torch.bfloat16, None),
    ("l2norm bf16", case_l2norm, torch.bfloat16, None),
    ("check_finite bf16", case_check_finite, torch.bfloat16, None),
    ("unscale+l2norm bf16", case_unscale_l2norm, torch.bfloat16, None),
    ("unscale fp16", case_unscale, torch.float16, None),
]


def main():
    args = harness.parser(__doc__.splitlines()[0]).parse_args()
    harness.setup(args)
    print(f"{args.numel:,} elements in {args.tensors} tensors on {args.device}, "
          f"{args.repeats} interleaved repeats, {torch.get_num_threads()} threads")
    copy_gbps = harness.copy_bandwidth(args.device)
    print(f"copy bandwidth (dst.copy_(src), read+write): {copy_gbps:.1f} GB/s\n")

    rows = []
    for label, case, dtype, target in CASES:
        base_name, base, core, moved = case(args, dtype)
        bt, ct = harness.time_ab(base, core, args.device, args.repeats, args.warmup)
        r = harness.row(label, base_name, bt, ct, target, bytes_moved=moved)
        r["core_ops_gbps"] = harness.gbps(moved, r["core_ops_ms"])
        r["baseline_gbps"] = harness.gbps(moved, r["baseline_ms"])
        rows.append(r)
        del base, core  # free this case's tensors before the next one allocates

    print()
    harness.compare(rows)
    print(f"\nEffective bandwidth (bytes each op must read + write) vs copy {copy_gbps:.1f} GB/s:\n")
    print("| case | MB moved | baseline GB/s | core_ops GB/s | core_ops % of copy |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['case']} | {r['bytes_moved'] / 1e6:.0f} | {r['baseline_gbps']:.1f} "
              f"| {r['core_ops_gbps']:.1f} | {100 * r['core_ops_gbps'] / copy_gbps:.0f}% |")

    if args.plot:
        harness.plot(rows, args.plot, f"multi-tensor ops, {args.numel:,} elements, {args.device}")
    if args.json:
        harness.write_json(args.json, rows, copy_gbps=copy_gbps, args=vars(args))
    failed = [r["case"] for r in rows if r["passed"] is False]
    if failed:
        print(f"\nmissed target: {', '.join(failed)}")


if __name__ == "__main__":
    main()
