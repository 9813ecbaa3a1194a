"""A lost process under `accelerate launch` (fault_train.py: ApexPlugin O2-bf16, core_ops
DDP, 2 gloo processes, save_state after each step): rank 1 SIGKILLed mid-step stops
the survivor within seconds with core_ops DDP's error naming rank 1, and Accelerate's
launcher (torchrun's agent) reports it as the root cause; launched again, the run
resumes with ``load_state`` and ends bit-identical to an uninterrupted run."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).parent
ACCELERATE = str(Path(sys.executable).with_name("accelerate"))


def launch(out, *args):
    env = dict(os.environ, ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    t0 = time.monotonic()
    # A run with a kill: the agent looks every 3 s, not 0.1 s, else on a busy machine it
    # SIGTERMs the survivor before the survivor's error names the lost rank (docs/faults.md).
    monitor = ["--monitor_interval", "3"] if "--kill" in args else []
    proc = subprocess.run([ACCELERATE, "launch", "--multi_gpu", "--num_processes", "2", *monitor,
                           str(HERE / "fault_train.py"), str(out), *args],
                          env=env, capture_output=True, text=True, timeout=300)
    return proc, time.monotonic() - t0


def finals(out):
    return [torch.load(Path(out) / f"final-rank{r}.pt", weights_only=True) for r in range(2)]


def test_a_killed_rank_stops_the_launch_naming_it_and_a_relaunch_resumes_bit_identical(tmp_path):
    killed, seconds = launch(tmp_path / "run", "--kill", "3")
    log = killed.stdout + killed.stderr
    assert killed.returncode != 0 and seconds < 60, (seconds, log[-3000:])
    assert re.search(r"failed on rank 0 of 2: rank 1 \(pid \d+\) is gone", log), log[-3000:]
    assert re.search(r"rank\s*: 1 \(local_rank: 1\)\s*\n\s*exitcode\s*: -9", log), log[-3000:]
    assert sorted(p.name for p in (tmp_path / "run").glob("step-*")) == ["step-0000", "step-0001", "step-0002"]
    resumed, _ = launch(tmp_path / "run")
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    assert "resumed from step-0002" in resumed.stdout + resumed.stderr
    straight, _ = launch(tmp_path / "straight")
    assert straight.returncode == 0, (straight.stdout + straight.stderr)[-3000:]
    for a, b in zip(finals(tmp_path / "run"), finals(tmp_path / "straight")):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
