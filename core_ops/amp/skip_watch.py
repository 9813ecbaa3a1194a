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


class SkipWatch:
    """Counts skipped iterations in a row on the device and raises ``NonFiniteTraining``
    once they reach ``limit`` (Note [Watching skips without a host sync])."""

    def __init__(self, limit):
        self.limit = limit  # checked by opt_levels.resolve
        self._run = None  # skipped iterations in a row, an int64 device tensor
        self._host = None  # its copy on the host (GPU), and the event that says it landed
        self._landed = None

    @torch.compiler.disable
    def observe(self, found, report, scale=None):
        """After an iteration's scale update: ``found`` its overflow flag; ``report()``
        the grads' description for the error; ``scale`` the scaler, for the message."""
        if self.limit is None:
            return
        bad = found.reshape(()) > 0
        run = bad.to(torch.int64) if self._run is None else torch.where(bad, self._run + 1, 0)
        self._run = run
        if run.device.type != "cuda":
            seen = int(run)
        else:
            seen = int(self._host) if self._landed is not None and self._landed.query() else None
            if self._host is None:
                self._host = torch.empty((), dtype=torch.int64, pin_memory=True)
            self._host.copy_(run, non_blocking=True)
            self._landed = torch.cuda.Event()
            self._landed.record()
        if seen is not None and seen >= self.limit:
            now = "" if scale is None else f"; the loss scale is {scale.get_scale():g}"
            raise NonFiniteTraining(
                f"{seen} steps in a row were skipped for inf / nan grads (max_consecutive_skips={self.limit}){now}. "
                f"{report()}. Check the data and the loss of these steps, or lower the learning rate; "
                "max_consecutive_skips=None skips forever")

    def reset(self):
        self._run, self._host, self._landed = None, None, None
