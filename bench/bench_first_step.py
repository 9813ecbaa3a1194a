"""From `import torch` done to the first FusedAdam step, in fresh processes: what a
user pays before training starts (issue target, with the wheel and no compiler: <= 3 s).

    python bench/bench_first_step.py [--runs 5]

Each run is a new interpreter that imports torch, then times `import core_ops`, one
FusedAdam step on a small model (the native CPU library loaded, or built, on the way)
and says which library served it. Prints each run and the median.
"""

import argparse
import statistics
import subprocess
import sys

CHILD = """
import time, torch
t0 = time.perf_counter()
import core_ops
from core_ops.optimizers import FusedAdam
model = torch.nn.Linear(256, 256)
opt = FusedAdam(model.parameters(), lr=1e-3)
model(torch.randn(8, 256)).sum().backward()
opt.step()
t1 = time.perf_counter()
from core_ops import native
print(f"{t1 - t0:.3f}", native.ensure("cpu").reason)
"""


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    seconds = []
    for _ in range(args.runs):
        out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True).stdout
        took, library = out.strip().splitlines()[-1].split(" ", 1)
        seconds.append(float(took))
        print(f"  {float(took):.3f} s  ({library[:110]})")
    print(f"import torch done -> first FusedAdam step: median {statistics.median(seconds):.3f} s "
          f"over {args.runs} fresh processes (min {min(seconds):.3f}, max {max(seconds):.3f})")


if __name__ == "__main__":
    main()
