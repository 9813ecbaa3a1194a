"""An Accelerate run for test_accelerate_faults.py under `accelerate launch` (2 gloo processes,
ApexPlugin O2-bf16, core_ops DDP): one step of each rank's batch at a time, a
``save_state`` after each step (written into a temporary folder, then renamed: a rank
killed while saving leaves the previous state), resumed with ``load_state`` from the
newest one. Final params go to OUT/final-rank<R>.pt.

    accelerate launch --multi_gpu --num_processes 2 fault_train.py OUT [--kill STEP]

``--kill S``: rank 1 SIGKILLs itself in step S before its backward.
"""

import os
import signal
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn

from core_ops_accelerate import ApexPlugin

STEPS = 6


def main():
    out = Path(sys.argv[1])
    kill = int(sys.argv[sys.argv.index("--kill") + 1]) if "--kill" in sys.argv else None
    accelerator = Accelerator(kwargs_handlers=[ApexPlugin(opt_level="O2", half_dtype="bf16")])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.Linear(32, 3))
    model, opt = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    rank = accelerator.process_index
    done = sorted(out.glob("step-*"))
    start = 0
    if done:
        accelerator.load_state(str(done[-1]))
        start = int(done[-1].name.split("-")[1]) + 1
        accelerator.print(f"resumed from {done[-1].name}")
    for step in range(start, STEPS):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(16, 12, generator=g), torch.randn(16, 3, generator=g)
        loss = F.mse_loss(model(x).float(), y)
        if (step, rank) == (kill, 1):
            os.kill(os.getpid(), signal.SIGKILL)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        partial = out / f".partial-step-{step:04d}"
        accelerator.save_state(str(partial))
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            os.replace(partial, out / f"step-{step:04d}")
        accelerator.wait_for_everyone()
    torch.save([p.detach().clone() for p in accelerator.unwrap_model(model).parameters()],
               out / f"final-rank{rank}.pt")


if __name__ == "__main__":
    main()
