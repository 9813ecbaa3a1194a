"""The state ``initialize`` leaves for ``scale_loss`` and the checkpoint functions, as
Apex kept it: one current configuration per process (a fresh ``initialize``, as a
resume does, replaces it)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class AmpState:
    properties: object
    loss_scalers: list
    models: list
    optimizers: list


_current: AmpState | None = None


def set_current(state):
    global _current
    _current = state


def current():
    if _current is None:
        raise RuntimeError("core_ops.amp is not initialized: call amp.initialize(model, optimizer, "
                           "opt_level=...) before amp.scale_loss or amp.state_dict")
    return _current
