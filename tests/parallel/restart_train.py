"""A data-parallel O2-bf16 run for test_restarts.py (and tools/soak_faults.py), launched
by torchrun: core_ops DDP, FusedAdam with fp32 masters, amp; a checkpoint after every
step (core_ops.checkpoints.save: model, optimizer, amp, the data position), resumed
from the newest one every rank can load (core_ops.checkpoints.latest_everywhere).

    torchrun --nproc-per-node 2 restart_train.py OUT [--kill RANK:STEP] [--tear STEP]

``--kill R:S``: rank R SIGKILLs itself in step S, after its backward, before the step
(a lost process mid-step), on torchrun's first attempt (TORCHELASTIC_RESTART_COUNT 0);
the tests launch again without it.
``--tear S``: on the first attempt rank 0 leaves the checkpoint of step S torn (half
its bytes, as ``torch.save`` straight to the file killed midway would) and a temporary
file of ``save``, then SIGKILLs itself. The final params go to OUT/final-rank<R>.pt.
"""

import argparse
import datetime
import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from core_ops import amp, checkpoints
from core_ops.optimizers import FusedAdam
from core_ops.parallel import DistributedDataParallel

STEPS = 8


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 12, generator=g), torch.randn(16, 3, generator=g)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--kill", default=None)
    p.add_argument("--tear", type=int, default=None)
    args = p.parse_args()
    out = Path(args.out)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
    rank = dist.get_rank()
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.Linear(32, 3))
    opt = FusedAdam(model.parameters(), lr=1e-2)
    model, opt = amp.initialize(model, opt, opt_level="O2", half_dtype=torch.bfloat16, verbosity=0)
    ddp = DistributedDataParallel(model)
    start = 0
    path, saved = checkpoints.latest_everywhere(out / f"rank{rank}", "step-*.pt")
    if saved is not None:
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        amp.load_state_dict(saved["amp"])
        start = saved["step"] + 1
        print(f"rank {rank} resumed from {path.name}", flush=True)
    kill_rank, kill_step = map(int, args.kill.split(":")) if args.kill else (None, None)
    for step in range(start, STEPS):
        x, y = batch(step, rank)
        loss = nn.functional.mse_loss(ddp(x).float(), y)
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        if first_attempt and (rank, step) == (kill_rank, kill_step):
            os.kill(os.getpid(), signal.SIGKILL)
        opt.step()
        opt.zero_grad()
        state = dict(model=model.state_dict(), optimizer=opt.state_dict(), amp=amp.state_dict(), step=step)
        target = out / f"rank{rank}" / f"step-{step:04d}.pt"
        if first_attempt and rank == 0 and step == args.tear:
            checkpoints.save(state, target.with_name("whole.tmp"))
            data = target.with_name("whole.tmp").read_bytes()
            target.write_bytes(data[: len(data) // 2])  # torn: half a checkpoint
            target.with_name(f".partial-{os.getpid()}-{target.name}").write_bytes(data[:100])
            target.with_name("whole.tmp").unlink()
            os.kill(os.getpid(), signal.SIGKILL)
        checkpoints.save(state, target)
    torch.save([p.detach().clone() for p in model.parameters()], out / f"final-rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
