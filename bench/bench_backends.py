"""FusedAdam where no native kernel can be built (Note [Backends] in
core_ops/native/__init__.py): on torch's fused kernel (backend 3) and on the reference
(backend 4) against torch.optim.AdamW(fused=True), in the same run.

    CXX=/bin/false CORE_OPS_CACHE_DIR=$(mktemp -d) python bench/bench_backends.py [--device cpu|cuda]

Target (issue 25): backend 3 <= 1.1 x torch's fused AdamW, 20M fp32 params in 200 tensors,
results equal within rtol 1e-5. The script refuses to run where a native kernel is
loaded for the device: it would time that instead.
"""

import os

import torch
from torch.testing import assert_close

import harness
from bench_adam import HYPER, make, with_grads
from core_ops import native
from core_ops._info import op_backend
from core_ops.optimizers import FusedAdam


def main():
    args = harness.parser(__doc__.splitlines()[0], repeats=20).parse_args()
    harness.setup(args)
    native.ensure(args.device, warn=False)
    if op_backend("fused_adam_", args.device) == "native":
        raise SystemExit("a native fused_adam_ is loaded: run with CXX=/bin/false and a fresh "
                         "CORE_OPS_CACHE_DIR (and no nvcc for cuda) to time backends 3 and 4")
    print(f"{args.numel:,} fp32 params in {args.tensors} tensors on {args.device}, {torch.get_num_threads()} "
          f"threads; fused_adam_ on {args.device}: {op_backend('fused_adam_', args.device)}")
    ours = with_grads(make(args.numel, args.tensors, torch.float32, args.device))
    theirs = with_grads(make(args.numel, args.tensors, torch.float32, args.device))
    opt, base = FusedAdam(ours, **HYPER), torch.optim.AdamW(theirs, fused=True, **HYPER)
    for _ in range(3):
        opt.step()
        base.step()
    assert_close(torch.cat([p.detach().flatten() for p in ours]), torch.cat([p.detach().flatten() for p in theirs]),
                 rtol=1e-5, atol=1e-7)
    rows = []
    bt, ct = harness.time_ab(base.step, opt.step, args.device, args.repeats, args.warmup)
    rows.append(harness.row("FusedAdam, 3 torch", "AdamW(fused=True)", bt, ct, 1.1))
    os.environ["CORE_OPS_BACKEND"] = "reference"  # backend 3 passed over: backend 4
    bt, ct = harness.time_ab(base.step, opt.step, args.device, max(args.repeats // 4, 3), 1)
    rows.append(harness.row("FusedAdam, 4 reference", "AdamW(fused=True)", bt, ct, None))
    harness.compare(rows)


if __name__ == "__main__":
    main()
