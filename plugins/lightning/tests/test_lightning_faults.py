"""A lost process under the Trainer (fault_fit.py: apex-O2-bf16 + apex-ddp or
apex-fsdp, 2 gloo processes, last.ckpt after every epoch): rank 1 SIGKILLed mid-step
stops rank 0 (the launcher that started it) within seconds with an error naming rank 1;
``fit(..., ckpt_path="last")`` then ends bit-identical to an uninterrupted run. apex-ddp
writes checkpoints atomically (Note [Atomic checkpoints]): no partial file is left
beside them (apex-fsdp's are torch.distributed.checkpoint folders)."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent


def fit(out, *args):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(HERE / "fault_fit.py"), str(out), *args], env=env, cwd=HERE,
                          capture_output=True, text=True, timeout=300)
    return proc, time.monotonic() - t0


def finals(out):
    return [torch.load(Path(out) / f"final-rank{r}.pt", weights_only=True) for r in range(2)]


@pytest.mark.parametrize("strategy", ["apex-ddp", "apex-fsdp"])
def test_a_killed_rank_stops_the_trainer_naming_it_and_last_ckpt_resumes_bit_identical(tmp_path, strategy):
    more = ["--fsdp"] if strategy == "apex-fsdp" else []
    killed, seconds = fit(tmp_path / "run", "--kill", "3", *more)
    log = killed.stdout + killed.stderr
    assert killed.returncode != 0 and seconds < 60, (seconds, log[-3000:])
    assert re.search(r"(DistributedDataParallel: the gradient allreduce|apex-(f?s)?dd?p: the [\w ]+) failed on rank 0"
                     r"( of 2)?: rank 1 \(pid \d+\) is gone", log), log[-3000:]
    saved = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert saved == ["epoch=0-step=1.ckpt", "epoch=1-step=2.ckpt", "epoch=2-step=3.ckpt", "last.ckpt"], saved
    resumed, _ = fit(tmp_path / "run", "--resume", *more)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    assert "Restored all states from the checkpoint at" in resumed.stdout + resumed.stderr
    straight, _ = fit(tmp_path / "straight", *more)
    assert straight.returncode == 0, (straight.stdout + straight.stderr)[-3000:]
    for a, b in zip(finals(tmp_path / "run"), finals(tmp_path / "straight")):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
