"""What a native op costs before its loops: the per-call, per-tensor work of checking a
call (Note [Op boundary]: devices, aliasing, layouts, dtypes) on tiny tensors, where it
is all there is. Best of many calls, one JSON line, for an A/B of two builds run
alternately (as kernel_times.py; docs: bench/README.md).

    python bench/bench_call_overhead.py
"""

import json
import time

import torch

import core_ops  # noqa: F401
from core_ops import native
from core_ops._schemas import op

assert native.ensure("cpu").native


def tmin(fn, n=300):
    for _ in range(20):
        fn()
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return round(best * 1e6, 1)


out = {}
for n in (1, 200, 2000):
    src = [torch.randn(8) for _ in range(n)]
    dst = [torch.empty(8) for _ in range(n)]
    scale, flag = torch.ones(1), torch.zeros(1)
    out[f"scale {n} x 8 (us)"] = tmin(lambda: op("multi_tensor_scale_")(src, dst, scale, flag))
    ps, gs = [torch.randn(8) for _ in range(n)], [torch.randn(8) for _ in range(n)]
    ms, vs, steps = [torch.zeros(8) for _ in range(n)], [torch.zeros(8) for _ in range(n)], [torch.zeros(1) for _ in range(n)]
    out[f"adam {n} x 8 (us)"] = tmin(lambda: op("fused_adam_")(ps, gs, ms, vs, [], [], steps, 1e-3, 0.9, 0.999, 1e-8,
                                                                 0.0, True, True, False, False, None, None, None))
print(json.dumps(out))
