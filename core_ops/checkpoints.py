"""Checkpoints that survive a lost process: ``save`` never leaves a file that loads as
good but is not, and ``latest`` resumes from the newest one that loads.

Note [Atomic checkpoints]: ``save`` writes to a temporary file beside the target,
flushes it to disk, then renames it over the target (``os.replace``, atomic on POSIX
and Windows) and flushes the directory, so a process killed at any moment leaves the
previous checkpoint or the new one, whole, under the target's name, and at worst a
temporary file that ``latest`` ignores. A file torn by another writer (``torch.save``
straight to the target, killed midway) fails to load: ``latest`` says so and takes
the one before it. Loading uses ``weights_only=True``: a checkpoint holds tensors and
plain containers only (every state core-ops saves does).
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import torch

_TEMPORARY = ".partial-"


def save(obj, path):
    """``torch.save(obj, path)``, atomically (Note [Atomic checkpoints])."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{_TEMPORARY}{os.getpid()}-{path.name}")
    try:
        with open(partial, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
    finally:
        if partial.exists():
            partial.unlink()
    _fsync_directory(path.parent)
    return path


def _fsync_directory(directory):
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # a directory cannot be opened on Windows: the rename is what counts
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _step_of(path):
    numbers = re.findall(r"\d+", path.stem)
    return int(numbers[-1]) if numbers else -1


def latest(directory, pattern="*.pt", map_location="cpu", at_most=None):
    """``(path, loaded)`` of the newest checkpoint in ``directory`` matching ``pattern``
    that loads (newest: the largest last number in the name, then the latest
    modification), or ``(None, None)`` when there is none; ``at_most``: only those whose
    number is at most that. One that fails to load (torn by a writer killed midway) is
    skipped with a warning naming it; temporary files of ``save`` are never considered."""
    directory = Path(directory)
    found = [p for p in directory.glob(pattern) if p.is_file() and not p.name.startswith(_TEMPORARY)
             and (at_most is None or _step_of(p) <= at_most)]
    found.sort(key=lambda p: (_step_of(p), p.stat().st_mtime), reverse=True)
    for path in found:
        try:
            return path, torch.load(path, map_location=map_location, weights_only=True)
        except Exception as e:  # a torn zip, a truncated pickle, a file that is not ours
            warnings.warn(f"checkpoint {path} does not load ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                          "resuming from the one before it", stacklevel=2)
    return None, None


def latest_everywhere(directory, pattern="*.pt", map_location="cpu", group=None):
    """``latest`` agreed across the ranks of ``group`` (collective: every rank calls it
    with its own directory): the newest number that every rank can load, so that ranks
    one of which lost its last checkpoint (killed while writing it) resume together from
    the one before. ``(None, None)`` on every rank when some rank has none."""
    import torch.distributed as dist
    path, loaded = latest(directory, pattern, map_location)
    mine = _step_of(path) if path is not None else -1
    device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"
    agreed = torch.tensor([mine], dtype=torch.int64, device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN, group=group)
    agreed = int(agreed)
    if agreed < 0:
        return None, None
    if agreed == mine:
        return path, loaded
    return latest(directory, pattern, map_location, at_most=agreed)
