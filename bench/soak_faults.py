"""The lost-process soak (issue 36; not in CI): for each route, N runs that SIGKILL rank
1 at a random step of a 2-process gloo run, then launch again and compare with an
uninterrupted run; and N runs that kill rank 0 while it writes a checkpoint (torn,
as torch.save straight to the file would leave it). Reports, per route, how many
runs stopped naming the lost rank (the survivor's error, or torchrun's root cause when
its agent stopped the survivor first), the slowest survivor's exit (the group timeout
is 20 s: the target is <= timeout + 10 s), and how many restarts ended bit-identical.

    python bench/soak_faults.py [--runs 10] [--routes ddp,lightning,accelerate,torn] [--seed 0]

Routes: ddp (torchrun + core_ops DDP + amp O2-bf16 + core_ops.checkpoints:
tests/parallel/restart_train.py), lightning (Trainer apex-O2-bf16 + apex-ddp,
ckpt_path="last": plugins/lightning/tests/fault_fit.py), accelerate (accelerate launch +
ApexPlugin, load_state: plugins/accelerate/tests/fault_train.py), torn (the ddp route,
rank 0 killed while writing a checkpoint).
"""

import argparse
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# The lost rank named by the survivor (core_ops DDP, the apex-ddp strategy) or by
# torchrun's agent, which may terminate the survivor before its next collective.
NAMED = re.compile(r"failed on rank 0( of 2)?: rank 1 \(pid \d+\) is gone|"
                   r"Root Cause[^\n]*\n(.*\n){0,4}\s*rank\s*: 1 \(local_rank: 1\)")


def port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env():
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", ACCELERATE_USE_CPU="1",
                PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests' / 'parallel'}")


def run(cmd, cwd=ROOT):
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env(), cwd=cwd, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - t0


def ddp(out, *args):
    torchrun = shutil.which("torchrun", path=str(BIN)) or "torchrun"
    return run([torchrun, "--nproc-per-node", "2", "--max-restarts", "0", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{port()}", str(ROOT / "tests/parallel/restart_train.py"),
                str(out), *args])


def lightning(out, *args):
    return run([sys.executable, str(ROOT / "plugins/lightning/tests/fault_fit.py"), str(out), *args],
               cwd=ROOT / "plugins/lightning/tests")


def accelerate(out, *args):
    return run([str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2",
                str(ROOT / "plugins/accelerate/tests/fault_train.py"), str(out), *args])


ROUTES = {  # name: (launcher, steps, the kill argument for a step, the relaunch arguments)
    "ddp": (ddp, 8, lambda s: ["--kill", f"1:{s}"], []),
    "lightning": (lightning, 6, lambda s: ["--kill", str(s)], ["--resume"]),
    "accelerate": (accelerate, 6, lambda s: ["--kill", str(s)], []),
    "torn": (ddp, 8, lambda s: ["--tear", str(s)], []),
}


def finals(out):
    return [torch.load(Path(out) / f"final-rank{r}.pt", weights_only=True) for r in range(2)]


def same(a, b):
    return all(torch.equal(x, y) for p, q in zip(a, b) for x, y in zip(p, q))


def soak(name, runs, rng, scratch):
    launch, steps, fault, again = ROUTES[name]
    rc, log, _ = launch(scratch / f"{name}-straight")
    assert rc == 0, log[-2000:]
    straight = finals(scratch / f"{name}-straight")
    named = identical = 0
    slowest = 0.0
    for i in range(runs):
        step = rng.randrange(1, steps) if name != "torn" else rng.randrange(1, steps - 1)
        out = scratch / f"{name}-{i}"
        rc, log, seconds = launch(out, *fault(step))
        slowest = max(slowest, seconds)
        named += rc != 0 and (name == "torn" or bool(NAMED.search(log)))
        rc, log, _ = launch(out, *again)
        identical += rc == 0 and same(finals(out), straight)
        print(f"  {name} run {i}: fault at step {step}, stopped in {seconds:.1f} s, "
              f"{'identical' if rc == 0 and same(finals(out), straight) else 'DIFFERENT: ' + log[-300:]}",
              flush=True)
    return dict(route=name, runs=runs, named=named, slowest=slowest, identical=identical)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--routes", default="ddp,lightning,accelerate,torn")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as scratch:
        rows = [soak(name, args.runs, rng, Path(scratch)) for name in args.routes.split(",")]
    print(f"\n{args.runs} runs per route, seed {args.seed}, torch {torch.__version__}\n")
    print("| route | runs | stopped naming the lost rank | slowest stop s (target <= 30) | restarts bit-identical |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        named = "-" if r["route"] == "torn" else f"{r['named']}/{r['runs']}"
        print(f"| {r['route']} | {r['runs']} | {named} | {r['slowest']:.1f} | {r['identical']}/{r['runs']} |")


if __name__ == "__main__":
    main()
