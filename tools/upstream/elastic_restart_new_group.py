"""Reproducer of a torch elastic bug (torch 2.14.1, gloo), needing torch alone:

    for i in 1 2 3 4; do torchrun --nproc-per-node 2 --max-restarts 1 \
        tools/upstream/elastic_restart_new_group.py; done

Rank 1 is SIGKILLed on the first attempt; torchrun restarts both ranks. On the second
attempt, building a group with ``dist.new_group()`` after ``init_process_group`` fails
in about half of the runs:

    RuntimeError: Gloo connectFullMesh failed with ... Connection refused, remote=[127.0.0.1]:PORT

A rank reads a peer address that a process of the first attempt wrote into the
agent's store (the new group's keys are not per attempt, unlike the default group's),
and dials a port nobody listens on. The default group alone restarts fine. Exit status
of torchrun: 1 when the bug shows. Relaunching torchrun (a fresh agent and store, as a
job scheduler's requeue does) does not show it.
"""

import datetime
import os
import signal

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
group = dist.new_group()
t = torch.ones(4)
dist.all_reduce(t, group=group)
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and dist.get_rank() == 1:
    os.kill(os.getpid(), signal.SIGKILL)
dist.all_reduce(t, group=group)
print("attempt", os.environ["TORCHELASTIC_RESTART_COUNT"], "rank", dist.get_rank(), "ok", flush=True)
dist.destroy_process_group()
