"""``scale_loss`` and the functions around it: Apex's calling convention over
``LossScaler`` and ``AmpOptimizer``."""

from __future__ import annotations

import contextlib
from collections import OrderedDict

import torch

from ..optimizers.larc import LARC
from . import _state


def _amp_of(optimizer, i):
    amp = getattr(optimizer, "_core_ops_amp", None)
    if amp is None:
        raise RuntimeError(f"optimizers[{i}] was not passed to amp.initialize; pass every optimizer "
                           "that scale_loss should unscale for")
    return amp


@contextlib.contextmanager
def scale_loss(loss, optimizers, loss_id=0, model=None, delay_unscale=False,
               delay_overflow_check=False):
    """Yields ``loss`` in float32 times loss scaler ``loss_id``'s scale; call
    ``.backward()`` on it inside the block. On leaving, the grads of ``optimizers``'
    params are unscaled (into the fp32 masters at O2) and checked for inf/nan, the
    scale is updated, and an overflow makes the optimizers' next ``step()`` change
    nothing, all without a host sync for fused optimizers (Note [Host syncs of loss
    scaling]). ``delay_unscale=True`` leaves the grads scaled, to accumulate several
    backward passes before the last, unscaling one. ``model`` is accepted for Apex's
    signature; ``delay_overflow_check`` too (the check never syncs anyway).
    """
    state = _state.current()
    props = state.properties
    if not props.enabled:
        yield loss
        return
    if not 0 <= loss_id < len(state.loss_scalers):
        raise ValueError(f"loss_id={loss_id} but amp.initialize was called with "
                         f"num_losses={len(state.loss_scalers)}; pass num_losses > {loss_id}")
    if isinstance(optimizers, (torch.optim.Optimizer, LARC)):
        optimizers = [optimizers]
    amps = [_amp_of(opt, i) for i, opt in enumerate(optimizers)]
    scaler = state.loss_scalers[loss_id]
    if not props.master_weights and scaler.fixed_scale == 1.0:
        # Nothing to unscale and, as in Apex, no overflow check (O0, O3).
        yield loss.float()
        return
    for amp in amps:
        if not delay_unscale and not amp.params_have_scaled_gradients:
            amp.prepare_backward()
    scale = scaler.scale_tensor(loss.device)
    yield loss.float() * scale
    if delay_unscale:
        for amp in amps:
            amp.params_have_scaled_gradients = True
        return
    found = torch.zeros(1, dtype=torch.float32, device=scale.device)
    for amp in amps:
        found = torch.maximum(found, amp.post_backward(scale))
        amp.params_have_scaled_gradients = False
    scaler.update_from(found)


def master_params(optimizer):
    """The params ``optimizer`` updates: the fp32 masters at O2, else the model's."""
    for group in optimizer.param_groups:
        yield from group["params"]


def state_dict(destination=None):
    """Apex's format: ``{'loss_scaler0': {'loss_scale': float, 'unskipped': int}, ...}``
    (plus the hysteresis count when hysteresis is on)."""
    destination = OrderedDict() if destination is None else destination
    for i, scaler in enumerate(_state.current().loss_scalers):
        sd = scaler.state_dict()
        entry = {"loss_scale": sd["scale"], "unskipped": sd["_growth_tracker"]}
        if scaler.hysteresis > 1:
            entry["_hysteresis_tracker"] = sd["_hysteresis_tracker"]
        destination[f"loss_scaler{i}"] = entry
    return destination


def load_state_dict(state_dict):
    """Restores the loss scalers from ``state_dict()`` (Apex's or this format)."""
    scalers = _state.current().loss_scalers
    saved = sorted(k for k in state_dict if k.startswith("loss_scaler"))
    if len(saved) != len(scalers):
        raise ValueError(f"the amp state dict has {len(saved)} loss scalers but amp.initialize "
                         f"made {len(scalers)} (num_losses)")
    for i, scaler in enumerate(scalers):
        scaler.load_state_dict(dict(state_dict[f"loss_scaler{i}"]))


@contextlib.contextmanager
def disable_casts():
    """Runs the block outside autocast (Apex's ``amp.disable_casts``)."""
    with contextlib.ExitStack() as stack:
        for device_type in ("cpu", "cuda"):
            if torch.amp.is_autocast_available(device_type):
                stack.enter_context(torch.autocast(device_type, enabled=False))
        yield
