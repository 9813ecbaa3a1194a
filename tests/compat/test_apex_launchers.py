"""An unmodified Apex data-parallel script (apex_ddp_train.py) run through the alias by
each launcher, as docs/apex-migration.md writes the command: torchrun, accelerate launch
and deepspeed, each starting 2 gloo processes on CPU. One launch per launcher serves
every assertion."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "parallel"))
from _launch import free_port  # noqa: E402

SCRIPT = str(Path(__file__).with_name("apex_ddp_train.py"))
BIN = Path(sys.executable).parent
ALIAS = "core_ops.compat.apex"


def command(launcher):
    """The launcher's command line before the script, and its environment."""
    if launcher == "torchrun":
        return [BIN / "torchrun", "--standalone", "--nproc-per-node", "2", "-m", ALIAS], {}
    if launcher == "accelerate":
        return ([BIN / "accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                 "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
                 "-m", ALIAS], dict(ACCELERATE_USE_CPU="1"))
    # deepspeed hands each rank --local_rank=N before the script: the alias moves it behind.
    return ([BIN / "deepspeed", "--num_gpus", "2", "--master_port", str(free_port()), "--module", ALIAS],
            dict(DS_ACCELERATOR="cpu"))


@pytest.fixture(scope="module", params=["torchrun", "accelerate", "deepspeed"])
def ranks(request, tmp_path_factory):
    launcher = request.param
    cmd, env = command(launcher)
    if not cmd[0].exists():
        pytest.skip(f"{cmd[0].name} is not installed in this environment (the test extra installs it)")
    out = tmp_path_factory.mktemp(launcher)
    proc = subprocess.run([str(c) for c in cmd] + [SCRIPT, "--out", str(out)], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **env))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return launcher, out, [torch.load(out / f"rank{r}.pt") for r in range(2)]


def test_each_rank_runs_the_script_on_core_ops(ranks):
    launcher, out, results = ranks
    for rank, r in enumerate(results):
        assert (r["rank"], r["local_rank"], r["world"]) == (rank, rank, 2)
        assert r["amp"] == "core_ops.amp"
        assert r["ddp"] == "core_ops.compat.apex.parallel.DistributedDataParallel"
        # The script's own arguments, behind them the launcher's rank where it passes one.
        rank_argument = [f"--local_rank={rank}"] if launcher == "deepspeed" else []
        assert r["argv"] == rank_argument + ["--out", str(out)]


def test_ranks_seeded_apart_end_bit_identical_and_learn(ranks):
    _, _, (r0, r1) = ranks
    assert len(r0["masters"]) == 6 and all(m.dtype == torch.float32 for m in r0["masters"])  # O2's masters
    for a, b in zip(r0["masters"], r1["masters"]):
        assert torch.equal(a, b)
    for r in (r0, r1):  # each rank's loss on its own batch, under the shared weights
        assert r["losses"][-1] < 0.8 * r["losses"][0]
