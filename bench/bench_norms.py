"""core_ops' fused layer norm and RMS norm against torch's, in the same run, medians:

    python bench/bench_norms.py [--device cuda] [--rows 8192 --hidden 4096] [--repeats 10]

  RMSNorm fwd+bwd     core_ops.normalization.rms_norm vs F.rms_norm      fp32 <= 0.3 x, bf16 <= 0.25 x
  LayerNorm fwd+bwd   core_ops.normalization.layer_norm vs F.layer_norm  <= 1.0 x (fp32, bf16)
  forward bandwidth   bytes a forward must move (read x, write y) / time, as a share of
                      this machine's copy bandwidth (harness.copy_bandwidth)   >= 70 %

A fwd+bwd step is forward, then backward with a fixed grad into x, weight and bias (the
grads are cleared, untimed, before each call). The memory_efficient lines show what it
saves: the bytes autograd holds between forward and backward.

On CPU every call's output is fresh memory; glibc hands blocks this large back to the
OS when freed, so each call page-faults its output in (x.clone() runs at the same
speed). ``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=100000000000`` in the environment
makes glibc keep them, and shows the kernels' own bandwidth.
"""

import torch
import torch.nn.functional as F

import harness
from core_ops.normalization import fused_add_rms_norm, layer_norm, rms_norm


def tensors(args, dtype, device):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.rows, args.hidden, generator=g).to(device, dtype).requires_grad_()
    w = (torch.rand(args.hidden, generator=g) + 0.5).to(device, dtype).requires_grad_()
    b = torch.randn(args.hidden, generator=g).to(device, dtype).requires_grad_()
    dy = torch.randn(args.rows, args.hidden, generator=g).to(device, dtype)
    return x, w, b, dy


def clear(*ts):
    def run():
        for t in ts:
            t.grad = None
    return run


def saved_bytes(fn):
    """The bytes autograd keeps for backward of ``fn()`` (its saved tensors, each once)."""
    seen = {}

    def pack(t):
        seen[t.data_ptr()] = t.nbytes
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def main():
    p = harness.parser(__doc__.splitlines()[0], repeats=10)
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=4096)
    args = p.parse_args()
    harness.setup(args)
    dev, rows, shape = args.device, [], (args.rows, args.hidden)
    for dtype, rms_target in ((torch.float32, 0.3), (torch.bfloat16, 0.25)):
        name = "fp32" if dtype == torch.float32 else "bf16"
        x, w, b, dy = tensors(args, dtype, dev)
        before = clear(x, w, b)
        cases = [
            (f"RMSNorm fwd+bwd {shape} {name}", "F.rms_norm", rms_target,
             lambda: F.rms_norm(x, (args.hidden,), w, 1e-5).backward(dy),
             lambda: rms_norm(x, (args.hidden,), w, 1e-5).backward(dy)),
            (f"LayerNorm fwd+bwd {shape} {name}", "F.layer_norm", 1.0,
             lambda: F.layer_norm(x, (args.hidden,), w, b, 1e-5).backward(dy),
             lambda: layer_norm(x, (args.hidden,), w, b, 1e-5).backward(dy)),
        ]
        for case, base_name, target, base, core in cases:
            bt, ct = harness.time_ab(base, core, dev, args.repeats, args.warmup, before=before)
            rows.append(harness.row(case, base_name, bt, ct, target))
        with torch.no_grad():
            for label, base_name, base, core in (
                    ("RMSNorm forward", "F.rms_norm", lambda: F.rms_norm(x, (args.hidden,), w, 1e-5),
                     lambda: rms_norm(x, (args.hidden,), w, 1e-5)),
                    ("LayerNorm forward", "F.layer_norm", lambda: F.layer_norm(x, (args.hidden,), w, b, 1e-5),
                     lambda: layer_norm(x, (args.hidden,), w, b, 1e-5)),
                    ("fused_add_rms_norm forward", "x + r, then F.rms_norm",
                     lambda: F.rms_norm(x + dy, (args.hidden,), w, 1e-5),
                     lambda: fused_add_rms_norm(x, dy, w, 1e-5)),
                    ("x.clone(), a copy into fresh memory", "x.clone()", lambda: x.clone(), lambda: x.clone())):
                bt, ct = harness.time_ab(base, core, dev, args.repeats, args.warmup)
                r = harness.row(f"{label} {shape} {name}", base_name, bt, ct)
                r["core_ops_gbps"] = harness.gbps(2 * x.nbytes, r["core_ops_ms"])
                rows.append(r)
        # What memory_efficient saves: a norm feeding a linear layer, as in a transformer
        # block. The linear layer keeps its input (the norm's output) anyway; keeping the
        # norm's input too is what memory_efficient avoids.
        lin = torch.randn(256, args.hidden, device=dev, dtype=dtype, requires_grad=True)
        for label, fn in (("LayerNorm", lambda me: layer_norm(x, (args.hidden,), w, b, 1e-5, me)),
                          ("RMSNorm", lambda me: rms_norm(x, (args.hidden,), w, 1e-5, me))):
            kept, efficient = (saved_bytes(lambda: F.linear(fn(me), lin)) for me in (False, True))
            print(f"{label} {name} -> linear: autograd keeps {kept / 2**20:.1f} MiB for backward, "
                  f"{efficient / 2**20:.1f} MiB with memory_efficient=True")
    copy = harness.copy_bandwidth(dev)
    harness.report(rows, args)
    for r in rows:
        if "core_ops_gbps" in r and "clone" not in r["case"] and "fused_add" not in r["case"]:
            share = r["core_ops_gbps"] / copy
            print(f"{r['case']}: {r['core_ops_gbps']:.1f} GB/s, {100 * share:.0f}% of copy bandwidth "
                  f"({copy:.1f} GB/s) {'pass' if share >= 0.7 else 'FAIL'} (target >= 70%)")


if __name__ == "__main__":
    main()
