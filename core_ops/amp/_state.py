"""The state ``initialize`` leaves for ``scale_loss`` and the checkpoint functions, as
Apex kept it: one current configuration per process (a fresh ``initialize`` with
optimizers, as a resume does, replaces it; each optimizer also keeps its own call's
state, see ``handle.scale_loss``). ``_amp_state`` is Apex's view of it, for the
logging idiom ``amp._amp_state.loss_scalers[0].loss_scale()``."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class AmpState:
    properties: object
    loss_scalers: list
    models: list  # weak references (see frontend.initialize)
    optimizers: list  # weak references


_current: AmpState | None = None


def set_current(state):
    global _current
    _current = state


def current():
    if _current is None:
        raise RuntimeError("core_ops.amp is not initialized: call amp.initialize(model, optimizer, "
                           "opt_level=...) before amp.scale_loss or amp.state_dict")
    return _current


class _ApexAmpState:
    """Apex's ``amp._amp_state`` object, reading the current call's state."""

    @property
    def loss_scalers(self):
        return [] if _current is None else _current.loss_scalers

    @property
    def opt_properties(self):
        return None if _current is None else _current.properties

    def __repr__(self):
        return f"_amp_state(opt_properties={self.opt_properties}, loss_scalers={self.loss_scalers})"


_amp_state = _ApexAmpState()


def master_params(optimizer):
    """The params ``optimizer`` updates: the fp32 masters at O2, else the model's."""
    for group in optimizer.param_groups:
        yield from group["params"]
