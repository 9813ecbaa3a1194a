"""Two builds of the native kernels, the same benchmarks, alternated in one run: e.g. the
wheel's prebuilt CPU library against a JIT build (issue target: within 5%).

    python bench/bench_builds.py --side wheel=/venv-a/bin/python \\
        --side jit=/venv-b/bin/python:/path/to/a/checkout [--rounds 3] [--quick]

A side is NAME=PYTHON[:SOURCE]: the interpreter (its environment's core_ops), and a
source checkout put first on PYTHONPATH (a JIT build of that commit) if given. Each
round runs every benchmark once per side, sides alternating, each in a fresh process.
Every benchmark times core_ops against torch's own kernel in the same process, so the
comparison is of core_ops' ratio to torch on each side (machine noise common to both
halves of a process cancels); the table gives the median ratio per side and their
quotient (side 1 / side 2: above 1, side 1 is slower).
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
SCRIPTS = {  # script: arguments (--quick: smaller cases, for a noisy or busy machine)
    "bench_multi_tensor.py": ([], ["--repeats", "10", "--numel", "8000000"]),
    "bench_adam.py": ([], ["--repeats", "8", "--numel", "4000000"]),
    "bench_adam_compact.py": ([], []),
    "bench_norms.py": ([], ["--rows", "2048"]),
}
# harness.compare's rows: | case | `baseline` | 12.3 (IQR 0.4) | 10.1 (IQR 0.2) | 0.82 | ...
ROW = re.compile(r"^\| ([^|]+) \| ([^|]+) \| ([0-9.]+) \(IQR [0-9.]+\) \| ([0-9.]+) \(IQR [0-9.]+\) \|")


def parse_side(text):
    name, _, rest = text.partition("=")
    python, _, source = rest.partition(":")
    return name, python, source or None


def run(side, script, args):
    name, python, source = side
    env = dict(os.environ)
    if source:
        env["PYTHONPATH"] = source + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([python, str(BENCH / script), *args], capture_output=True, text=True, env=env,
                          cwd=str(BENCH), timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: {script} failed:\n{proc.stderr[-3000:]}")
    rows = {}
    for line in proc.stdout.splitlines():
        m = ROW.match(line)
        if m and m.group(1).strip() != "case":
            rows[f"{script[6:-3]}: {m.group(1).strip()}"] = float(m.group(4)) / float(m.group(3))
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--side", action="append", required=True, help="NAME=PYTHON[:SOURCE], twice")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--scripts", nargs="*", default=list(SCRIPTS))
    args = p.parse_args()
    sides = [parse_side(s) for s in args.side]
    if len(sides) != 2:
        raise SystemExit("give --side twice")
    ratios = {s[0]: {} for s in sides}
    for r in range(args.rounds):
        for script in args.scripts:
            order = sides if r % 2 == 0 else sides[::-1]
            for side in order:
                for case, ratio in run(side, script, SCRIPTS[script][args.quick]).items():
                    ratios[side[0]].setdefault(case, []).append(ratio)
        print(f"round {r + 1} of {args.rounds} done", file=sys.stderr, flush=True)
    a, b = sides[0][0], sides[1][0]
    print(f"| case | {a}: core_ops / torch | {b}: core_ops / torch | {a} / {b} |")
    print("|---|---:|---:|---:|")
    quotients = []
    for case in ratios[a]:
        if case not in ratios[b]:
            continue
        ra, rb = statistics.median(ratios[a][case]), statistics.median(ratios[b][case])
        quotients.append(ra / rb)
        print(f"| {case} | {ra:.3f} | {rb:.3f} | {ra / rb:.3f} |")
    print(f"\nmedian {a} / {b} over {len(quotients)} cases: {statistics.median(quotients):.3f} "
          f"(min {min(quotients):.3f}, max {max(quotients):.3f}); {args.rounds} rounds")


if __name__ == "__main__":
    main()
