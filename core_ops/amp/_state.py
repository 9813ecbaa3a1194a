"""The state ``initialize`` leaves for ``scale_loss`` and the checkpoint functions, as
Apex kept it: one current configuration per process (a fresh ``initialize`` with
optimizers, as a resume does, replaces it; each optimizer also keeps its own call's
state, see ``handle.scale_loss``). ``_amp_state`` is Apex's view of it, for the
logging idiom ``amp._amp_state.loss_scalers[0].loss_scale()``."""

from __future__ import annotations

import contextlib
import dataclasses


class O1Handle:
    """Apex's ``amp._amp_state.handle`` after an O1 ``initialize``. Apex's patched
    torch's functions and put them back on ``_deactivate()``; core_ops' O1 runs each
    model's forward under ``torch.autocast``, so ``_deactivate()`` ends that for the
    models of this call (their forwards then run in float32, as Apex's did once the
    functions were restored) and ``_disable_casts()`` pauses it for a block."""

    def __init__(self):
        self._is_active = True
        self._deactivated = False

    def is_active(self):
        return self._is_active and not self._deactivated

    @contextlib.contextmanager
    def _disable_casts(self):
        was, self._is_active = self._is_active, False
        try:
            yield
        finally:
            self._is_active = was

    def _deactivate(self):
        self._deactivated = True


class NoCastsHandle(O1Handle):
    """The handle of every level but O1 (and before ``initialize``): no casts to switch."""

    def is_active(self):
        return False

    def _deactivate(self):
        pass


@dataclasses.dataclass
class AmpState:
    properties: object
    loss_scalers: list
    models: list  # weak references (see frontend.initialize)
    optimizers: list  # weak references
    handle: O1Handle = dataclasses.field(default_factory=NoCastsHandle)
    watches: list = dataclasses.field(default_factory=list)  # a SkipWatch per loss scaler
    routed: object = None  # the settings.Resolved it came from: errors name the user's spelling


_current: AmpState | None = None
_legacy = None  # the active amp.init() handle (legacy_init.py)


def legacy_handle():
    return _legacy


def set_legacy_handle(handle):
    global _legacy
    _legacy = handle


def set_current(state):
    global _current
    _current = state


def current():
    if _current is None:
        raise RuntimeError("core_ops.amp is not initialized: call amp.initialize(model, optimizer, "
                           "opt_level=...) before amp.scale_loss or amp.state_dict")
    return _current


class _ApexAmpState:
    """Apex's ``amp._amp_state`` object, reading the current call's state.
    ``allow_incoming_model_not_fp32 = True`` lets ``initialize`` take models whose
    params are already half, as in Apex (its tests set it around the call)."""

    allow_incoming_model_not_fp32 = False

    @property
    def loss_scalers(self):
        return [] if _current is None else _current.loss_scalers

    @property
    def opt_properties(self):
        return None if _current is None else _current.properties

    @property
    def handle(self):
        if _legacy is not None:
            return _legacy
        return NoCastsHandle() if _current is None else _current.handle

    def __repr__(self):
        return f"_amp_state(opt_properties={self.opt_properties}, loss_scalers={self.loss_scalers})"


_amp_state = _ApexAmpState()


def master_params(optimizer):
    """The params ``optimizer`` updates: the fp32 masters at O2, else the model's."""
    for group in optimizer.param_groups:
        yield from group["params"]
