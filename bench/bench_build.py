"""Build-time targets: a cold build of all CPU kernels (fresh cache folder) and the
load of a cached build, each in a fresh process as a user meets them.

    .venv/bin/python bench/bench_build.py [--cuda] [--repeats 5]

Targets (2 cores): cold CPU build <= 90 s; loading a cached build <= 1 s.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

LOAD = ("import time, core_ops; from core_ops import _build; t = time.perf_counter(); "
        "b = native.ensure({kind!r}); print(time.perf_counter() - t, b.native)")


def timed(kind, cache):
    env = dict(os.environ, CORE_OPS_CACHE_DIR=cache)
    out = subprocess.run([sys.executable, "-c", LOAD.format(kind=kind)], env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    if out[1] != "True":
        raise SystemExit(f"{kind} kernels did not load natively")
    return float(out[0])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cuda", action="store_true", help="also time the CUDA build")
    parser.add_argument("--repeats", type=int, default=5, help="cached loads to time")
    args = parser.parse_args()
    print("| library | cold build s | cached load s (median) | targets |\n|---|---|---|---|")
    for kind in ["cpu"] + (["cuda"] if args.cuda else []):
        with tempfile.TemporaryDirectory() as cache:
            t0 = time.perf_counter()
            cold = timed(kind, cache)
            wall = time.perf_counter() - t0
            loads = [timed(kind, cache) for _ in range(args.repeats)]
            target = "build <= 90 s, load <= 1 s" if kind == "cpu" else "load <= 1 s"
            print(f"| {kind} | {cold:.1f} (process {wall:.1f}) | {statistics.median(loads):.3f} | {target} |")


if __name__ == "__main__":
    main()
