"""The overflow flags of the torch.amp.GradScaler that is stepping an optimizer, for a
step that finds an overflow GradScaler could not see (Note [Overflowing norms] in
optimizers/_base.py: finite grads whose norm overflows float32).

GradScaler hands an optimizer with ``_step_supports_amp_scaling`` a ``found_inf`` it
sums afresh for each step, and its ``update()`` reads only its own per-device flags;
it passes no reference to itself (its ``grad_scaler`` keyword protocol is deprecated).
So the scaler is found on the call stack, as the ``self`` of the frame running
``GradScaler.step`` for this optimizer, and its per-device flags are handed back to be
set (tools/upstream/grad_scaler_misses_step_overflow.py shows the scale growing
without this)."""

from __future__ import annotations

import sys

import torch

from ._patch import Patch

WHEN_OFF = ("a step that torch.amp.GradScaler runs and that is skipped for a norm overflowing float32 (LAMB's "
            "clipping norm, NovoGrad's layer norms) leaves GradScaler's scale growing; core_ops.amp.LossScaler "
            "(or step(grad_scale=, found_inf=)) sees the skip without it.")
PATCH = Patch(__name__, ("2.10", "2.16"), "tools/upstream/grad_scaler_misses_step_overflow.py", WHEN_OFF)


def found_inf_of_calling_scaler(optimizer, depth=16):
    """One of the per-device ``found_inf`` flags that the torch.amp.GradScaler running
    ``optimizer.step()`` (directly or through ``step(grad_scaler=...)``) reads in its
    ``update()``; None when no GradScaler is stepping it or ``PATCH`` is off."""
    if not PATCH.active():
        return None
    frame = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            return None
        if (frame.f_code is torch.amp.GradScaler.step.__code__
                and frame.f_locals.get("optimizer") is optimizer):
            flags = frame.f_locals["self"]._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
            return next(iter(flags.values()), None)
        frame = frame.f_back
    return None
