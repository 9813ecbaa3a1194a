"""Which rank is gone, for the error of a collective that failed because a process of
the group died (killed, out of memory, its node lost).

Note [Naming a lost rank]: gloo reports a dead peer as "Connection reset by peer
[address]" and NCCL as a timeout, neither naming the rank. So when DDP is built,
each rank writes its host and pid into the process group's store; after a collective
fails, the survivor reads them back and names every rank whose process on this host
is gone (or a zombie). A rank on another host cannot be checked from here: the error
says so. When the store itself is unreachable, the process that served it (rank 0,
unless torchrun's agent serves it) is the one gone.
"""

from __future__ import annotations

import datetime
import os
import socket
import time

import torch.distributed as dist

_KEY = "core_ops/rank/{}"


def _store():
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # no default group, or a torch without the helper
        return None


def register():
    """Writes this rank's host and pid into the default group's store."""
    store = _store()
    if store is None:
        return
    try:
        store.set(_KEY.format(dist.get_rank()), f"{socket.gethostname()} {os.getpid()}")
    except Exception:
        pass


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed child not yet reaped by its parent (Lightning's launcher) is a zombie
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def diagnosis(settle_s=2.0):
    """One sentence naming the ranks that are gone, as far as this host can tell. A
    peer's sockets close while it is still exiting: its process is looked for again for
    up to ``settle_s`` seconds before it is called alive."""
    store = _store()
    if store is None or not dist.is_initialized():
        return "a rank of the process group is gone or stuck"
    here, me = socket.gethostname(), dist.get_rank()
    try:
        store.set_timeout(datetime.timedelta(seconds=5))
        peers = {rank: store.get(_KEY.format(rank)).decode().split()
                 for rank in range(dist.get_world_size()) if rank != me}
    except Exception:
        return ("the process group's store is unreachable: the process that served it (rank 0, unless a "
                "launcher's agent serves it) is gone")
    elsewhere = [rank for rank, (host, _) in peers.items() if host != here]
    deadline = time.monotonic() + settle_s
    while True:
        gone = [f"rank {rank} (pid {pid})" for rank, (host, pid) in peers.items()
                if host == here and not _alive(int(pid))]
        if gone or time.monotonic() > deadline or len(elsewhere) == len(peers):
            break
        time.sleep(0.05)
    if gone:
        return f"{', '.join(gone)} {'is' if len(gone) == 1 else 'are'} gone"
    if elsewhere:
        return (f"no rank on this host is gone; rank(s) {elsewhere} run on other hosts, one of which is gone or "
                "stuck")
    return "every rank's process is alive: one is stuck or its connection broke"
