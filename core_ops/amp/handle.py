"""``scale_loss`` and the functions around it: Apex's calling convention over
``LossScaler`` and ``AmpOptimizer``."""

from __future__ import annotations

import contextlib
import warnings
from collections import OrderedDict

import torch

from ..optimizers.larc import LARC
from . import _state
from .loss_scaler import load_saved_at_level
from .skip_watch import describe_grads, grad_report as grad_report_of, named_amp_grads
from ._state import master_params  # noqa: F401  (Apex kept it in _amp_state)


def _amps_and_state(optimizers):
    """The AmpOptimizers of ``optimizers`` and the state of the one ``initialize`` call
    they came from (its properties and loss scalers); ``(None, None)`` when amp was
    initialized with ``enabled=False``."""
    if isinstance(optimizers, (torch.optim.Optimizer, LARC)):
        optimizers = [optimizers]
    amps = [getattr(opt, "_core_ops_amp", None) for opt in optimizers]
    if not all(amps):
        if not _state.current().properties.enabled:
            return None, None
        raise RuntimeError(f"optimizers[{amps.index(None)}] was not passed to amp.initialize; pass "
                           "every optimizer that scale_loss should unscale for")
    states = {id(a.state): a.state for a in amps}
    if len(states) > 1:
        raise ValueError("scale_loss got optimizers from different amp.initialize calls, whose "
                         "loss scalers differ; call scale_loss once per call's optimizers")
    return amps, (amps[0].state if amps else _state.current())


@contextlib.contextmanager
def scale_loss(loss, optimizers, loss_id=0, model=None, delay_unscale=False,
               delay_overflow_check=False):
    """Yields ``loss`` in float32 times loss scaler ``loss_id``'s scale; call
    ``.backward()`` on it inside the block. On leaving, the grads of ``optimizers``'
    params are unscaled (into the fp32 masters at O2) and checked for inf/nan, the
    scale is updated, and an overflow makes the next ``step()`` of every one of
    ``optimizers`` change nothing (as in Apex), all without a host sync for fused
    optimizers (Note [Host syncs of loss scaling]). ``delay_unscale=True`` leaves the
    grads scaled, to accumulate several backward passes before the last, unscaling
    one. ``model`` is accepted for Apex's signature. ``delay_overflow_check=True``, as
    in Apex, leaves the scale and the coming step alone: the caller checks (the flag
    is the scaler's ``_overflow_buf``; ``update_scale()`` applies it). The scalers and
    properties are those of the ``initialize`` call the optimizers came from.
    """
    amps, state = _amps_and_state(optimizers)
    if state is None or not state.properties.enabled:
        yield loss
        return
    if not 0 <= loss_id < len(state.loss_scalers):
        raise ValueError(f"loss_id={loss_id} but amp.initialize was called with "
                         f"num_losses={len(state.loss_scalers)}; pass num_losses > {loss_id}")
    scaler = state.loss_scalers[loss_id]
    if not state.properties.fp32_masters and scaler.fixed_scale == 1.0 and not state.properties.skip_nonfinite:
        # Nothing to unscale and, as in Apex, no overflow check (O0, O3).
        yield loss.float()
        return
    # Note [Skipping non-finite steps]: with skip_nonfinite a static scale of 1 takes
    # the path below like a dynamic one: the grads are "unscaled" by 1 in one
    # multi-tensor pass that flags an inf / nan, the flag skips the coming step on the
    # device (a fused optimizer reads it, Note [amp's flag in the step]) and the
    # static scaler counts the skip. The pass is the guard's whole cost.
    scale = scaler.scale_tensor(loss.device)
    for amp in amps:
        amp.adopt_written_weights()
        if not delay_unscale and not amp.params_have_scaled_gradients:
            amp.prepare_backward(scale)
    yield loss.float() * scale
    if delay_unscale:
        for amp in amps:
            amp.params_have_scaled_gradients = True
        return
    found = torch.zeros(1, dtype=torch.float32, device=scale.device)
    flags_before = [amp.found_inf for amp in amps]
    for amp in amps:
        found = torch.maximum(found, amp.post_backward(scale))
        amp.params_have_scaled_gradients = False
    if delay_overflow_check:
        # Apex's meaning: the grads are unscaled, but neither is the scale updated nor
        # the step skipped; the caller decides, e.g. with scaler.update_scale(), which
        # reads this flag (NVIDIA's BERT, after its own allreduce).
        for amp, flag in zip(amps, flags_before):
            amp.found_inf = flag
        scaler.note_overflow(found)
        return
    for amp in amps:  # one overflow skips every optimizer of this loss, as in Apex
        amp.found_inf = torch.maximum(amp.found_inf, found.to(amp.found_inf.device))
    scaler.update_from(found)
    if state.watches and state.watches[loss_id].active:
        state.watches[loss_id].observe(found, lambda: describe_grads(state, amps), scaler)


def grad_report():
    """Each param's grad now, by name (``named_parameters`` of the models given to
    ``initialize``): ``{name, shape, numel, nonfinite, max_abs_finite}`` dicts, the
    fp32 master's unscaled grad for a half param with one. For finding the tensor that
    overflows: call it after ``scale_loss``, before ``zero_grad`` (host syncs)."""
    state = _state.current()
    amps = [opt._core_ops_amp for ref in state.optimizers if (opt := ref()) is not None]
    return grad_report_of(named_amp_grads(state, amps))


def _scaler(loss_id):
    scalers = _state.current().loss_scalers
    if not 0 <= loss_id < len(scalers):
        raise ValueError(f"loss_id must be in [0, {len(scalers)}) (num_losses of amp.initialize), "
                         f"got {loss_id}")
    return scalers[loss_id]


def loss_scale(loss_id=0):
    """The current scale of loss scaler ``loss_id`` as a float (a host sync, for logging)."""
    return _scaler(loss_id).get_scale()


def skipped_steps(loss_id=0):
    """How many iterations loss scaler ``loss_id`` skipped for overflow (a host sync)."""
    return _scaler(loss_id).skipped_steps


def state_dict(destination=None):
    """Apex's format: ``{'loss_scaler0': {'loss_scale': float, 'unskipped': int}, ...}``
    (plus the hysteresis count when hysteresis is on), each entry also naming the opt
    level and whether it scales dynamically, which Apex's loader ignores and ours
    checks (a resume at another level warns, as the plugins do)."""
    destination = OrderedDict() if destination is None else destination
    current = _state.current()
    for i, scaler in enumerate(current.loss_scalers):
        sd = scaler.state_dict()
        entry = {"loss_scale": sd["scale"], "unskipped": sd["_growth_tracker"],
                 "opt_level": current.properties.opt_level, "dynamic": scaler.dynamic}
        if scaler.hysteresis > 1:
            entry["_hysteresis_tracker"] = sd["_hysteresis_tracker"]
        destination[f"loss_scaler{i}"] = entry
    return destination


def load_state_dict(state_dict):
    """Restores the loss scalers from ``state_dict()`` (Apex's or this format). A
    different number of scalers than ``num_losses`` warns and loads those that match,
    as Apex did; a key that is no loss scaler's raises."""
    scalers = _state.current().loss_scalers
    unexpected = [k for k in state_dict if not k.startswith("loss_scaler")]
    if unexpected:
        raise RuntimeError(f"unexpected keys in the amp state dict: {unexpected}; expected "
                           "'loss_scaler0', 'loss_scaler1', ...")
    saved = [k for k in state_dict if k.startswith("loss_scaler")]
    if len(saved) != len(scalers):
        warnings.warn(f"the amp state dict has {len(saved)} loss scalers but amp.initialize made "
                      f"{len(scalers)} (num_losses); loading the first {min(len(saved), len(scalers))}",
                      stacklevel=2)
    level = _state.current().properties.opt_level
    for i, scaler in enumerate(scalers):
        if f"loss_scaler{i}" not in state_dict:
            continue
        entry = dict(state_dict[f"loss_scaler{i}"])
        saved_level = entry.pop("opt_level", level)  # Apex's own files name none
        load_saved_at_level(scaler, entry, saved_level, level, f"loss scaler {i}")


@contextlib.contextmanager
def disable_casts():
    """Runs the block outside autocast (Apex's ``amp.disable_casts``)."""
    with contextlib.ExitStack() as stack:
        for device_type in ("cpu", "cuda"):
            if torch.amp.is_autocast_available(device_type):
                stack.enter_context(torch.autocast(device_type, enabled=False))
        yield
