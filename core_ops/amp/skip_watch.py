"""What amp says when training goes wrong: ``grad_report`` (each param's grad: how many
non-finite elements, the largest finite magnitude, by parameter name) and
``SkipWatch``, which stops a run whose steps are skipped ``max_consecutive_skips``
times in a row instead of letting it skip forever.

Note [Watching skips without a host sync]: the count of skips in a row lives on the
device, updated by each iteration's overflow flag. On a CPU it is read at once (a
read, not a wait). On a GPU it is copied to pinned host memory without blocking and
read at a later iteration, once the copy has landed (``Event.query``), so a normal
step never waits for the device; a run is stopped an iteration or two late.
"""

from __future__ import annotations

import math
import sys
import time

import torch

from .._sharded import local


class NonFiniteTraining(RuntimeError):
    """A run stopped by ``max_consecutive_skips``: its grads keep overflowing."""


def grad_report(named_grads):
    """[{name, shape, numel, nonfinite, max_abs_finite}] for each (name, grad) with a
    dense grad (DTensors: this rank's shards), in the order given. Host syncs: one a
    tensor (for reports, never on a normal step)."""
    rows = []
    with torch.no_grad():
        for name, grad in named_grads:
            if grad is None or grad.is_sparse:
                continue
            g = local(grad).detach()
            finite = torch.isfinite(g)
            nonfinite = int(finite.numel() - finite.sum())
            kept = g[finite]
            peak = float(kept.abs().max()) if kept.numel() else math.nan
            rows.append(dict(name=name, shape=tuple(grad.shape), numel=grad.numel(), nonfinite=nonfinite,
                             max_abs_finite=peak))
    return rows


def describe(rows, first=5):
    """The non-finite rows of ``grad_report``, the first ``first`` of them by name."""
    bad = [r for r in rows if r["nonfinite"]]
    if not bad:
        return "no grad holds an inf or nan now (the flag came from a norm that overflowed float32)"
    shown = "; ".join(f"{r['name']} {tuple(r['shape'])}: {r['nonfinite']} of {r['numel']} non-finite, "
                      f"max |finite| {r['max_abs_finite']:.3g}" for r in bad[:first])
    more = f" (and {len(bad) - first} more tensors)" if len(bad) > first else ""
    return f"{len(bad)} of {len(rows)} grads hold an inf or nan: {shown}{more}"


def named_amp_grads(state, amps):
    """(name, grad) of every param ``amps`` (AmpOptimizers) step, named as in the models
    of ``state`` (an AmpState): a half param with an fp32 master by its own name, with
    the master's grad (the unscaled one the step reads)."""
    names = {}
    for model in (m for ref in state.models if (m := ref()) is not None):
        for name, p in model.named_parameters():
            names.setdefault(id(p), name)

    def named(p):
        return names.get(id(p), f"<unnamed param {tuple(p.shape)}>")

    out = []
    for amp in amps:
        out.extend((named(p), m.grad) for p, m in amp.pairs)
        out.extend((named(p), p.grad) for p in amp.fp32_params)
    return out


def describe_grads(state, amps):
    """``describe`` of the grads of ``amps``, for NonFiniteTraining's message."""
    return describe(grad_report(named_amp_grads(state, amps)))


def _to_stderr(line):
    print(line, file=sys.stderr, flush=True)


def _rank():
    import torch.distributed as dist
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class SkipWatch:
    """Counts skipped iterations on the device: in a row, to raise ``NonFiniteTraining``
    once they reach ``limit`` (0: never), and in all, for the line rank 0 prints when
    steps were skipped, at most one each ``report_seconds`` (0: never), so that a
    framework's console shows what its progress bar hides (Note [Watching skips without
    a host sync]: both counts are read the same way)."""

    def __init__(self, limit=0, report_seconds=0.0, say=None):
        self.limit = limit or 0  # checked by settings.resolve
        self.report_seconds = report_seconds or 0.0
        self.say = say or _to_stderr  # (a function of the module: a spawned rank gets the watch pickled)
        self._counts = None  # [skips in a row, skips in all], int64 on the device
        self._host = None  # their copy on the host (GPU), and the event that says it landed
        self._landed = None
        self._reported, self._reported_at = 0, None  # skips in the last line, and when

    @property
    def active(self):
        return bool(self.limit or self.report_seconds)

    @torch.compiler.disable
    def observe(self, found, report, scale=None):
        """After an iteration's scale update: ``found`` its overflow flag; ``report()``
        the grads' description for the error; ``scale`` the scaler, for the message."""
        if not self.active:
            return
        bad = found.reshape(()).to(torch.int64).clamp(max=1)
        if self._counts is None:
            counts = torch.stack([bad, bad])
        else:
            counts = torch.stack([torch.where(bad > 0, self._counts[0] + 1, 0), self._counts[1] + bad])
        self._counts = counts
        now = counts.device.type != "cuda"  # read at once: these are this iteration's grads
        if now:
            seen = counts.tolist()
        else:
            seen = self._host.tolist() if self._landed is not None and self._landed.query() else None
            if self._host is None:
                self._host = torch.empty(2, dtype=torch.int64, pin_memory=True)
            self._host.copy_(counts, non_blocking=True)
            self._landed = torch.cuda.Event()
            self._landed.record()
        if seen is None:
            return
        in_a_row, in_all = seen
        if self.limit and in_a_row >= self.limit:
            where = "" if scale is None else f"; the loss scale is {scale.get_scale():g}"
            raise NonFiniteTraining(
                f"{in_a_row} steps in a row were skipped for inf / nan grads (max_consecutive_skips={self.limit})"
                f"{where}. {report()}. Check the data and the loss of these steps, or lower the learning rate; "
                "max_consecutive_skips=0 skips forever")
        if self.report_seconds and in_all > self._reported:
            self._report(in_all, in_a_row, report if now and in_a_row else None, scale)

    def _report(self, in_all, in_a_row, report, scale):
        clock = time.monotonic()
        if self._reported_at is not None and clock - self._reported_at < self.report_seconds:
            return
        new = in_all - self._reported
        self._reported, self._reported_at = in_all, clock
        if _rank() != 0:
            return
        parts = [f"core-ops: {in_all} optimizer step{'s' if in_all > 1 else ''} skipped for inf / nan grads so far"
                 + (f" ({new} since the last line)" if new != in_all else "")]
        if scale is not None:
            parts.append(f"loss scale now {scale.get_scale():g}")
        if report is not None:
            parts.append(f"this step: {report()}")
        elif in_a_row == 0:
            parts.append("the last step was clean")
        self.say("; ".join(parts) + f" (at most one such line each {self.report_seconds:g} s)")

    def reset(self):
        self._counts, self._host, self._landed = None, None, None
