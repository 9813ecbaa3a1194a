"""Two "nodes" on loopback: `torchrun --nnodes 2 --nproc-per-node 1` started twice
(node ranks 0 and 1, static rendezvous at 127.0.0.1) runs torchrun_train.py; both
ranks must end with identical params and buffers."""

import shutil
import subprocess
import sys
from pathlib import Path

import torch

from _launch import HERE, free_port, rank_env


def _torchrun():
    exe = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    return [exe] if exe else [sys.executable, "-m", "torch.distributed.run"]


def test_two_nodes_end_identical(tmp_path):
    port = free_port()
    nodes = [subprocess.Popen(
        _torchrun() + ["--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node),
                       "--master-addr", "127.0.0.1", "--master-port", str(port),
                       "--max-restarts", "0", str(HERE / "torchrun_train.py"), str(tmp_path)],
        env=rank_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for node in range(2)]
    try:
        logs = [p.communicate(timeout=120)[0] for p in nodes]
    finally:
        for p in nodes:
            p.kill()
    assert all(p.returncode == 0 for p in nodes), "\n".join(log[-3000:] for log in logs)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert r0["world"] == r1["world"] == 2
    for a, b in zip(r0["params"] + r0["buffers"], r1["params"] + r1["buffers"]):
        assert torch.equal(a, b)
    assert any(not torch.equal(a, b) for a, b in zip(r0["initial"], r0["params"]))  # it trained
    assert any(not torch.equal(a, b) for a, b in zip(r0["initial"], r1["initial"]))  # not by luck
