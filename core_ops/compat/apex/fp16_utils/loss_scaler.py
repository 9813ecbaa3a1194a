"""Apex's ``fp16_utils`` loss scalers, for scripts that scale by hand: ``LossScaler``
(a fixed scale) and ``DynamicLossScaler`` (halve on overflow, double after
``scale_window`` clean iterations). ``FP16_Optimizer`` does not use them: it keeps its
scale in core_ops' ``LossScaler`` (on the device), as Apex's did in amp's."""

from __future__ import annotations

import torch

from ....multi_tensor_apply import multi_tensor_check_finite
from .fp16util import to_python_float  # noqa: F401  (Apex exported it from here too)


def _grads_overflow(params):
    """Whether any grad of ``params`` holds an inf or nan: one multi-tensor pass per
    (device, dtype), one host sync."""
    groups = {}
    for p in params:
        if p.grad is not None:
            groups.setdefault((p.grad.device, p.grad.dtype), []).append(p.grad)
    return any(bool(multi_tensor_check_finite(grads).item()) for grads in groups.values())


def windowed_update(scale, factor, window, iteration, last_overflow, overflow):
    """Apex's pre-amp dynamic scale rule for one iteration: ``(scale, last_overflow)``
    after it. An overflow divides the scale by ``factor`` (never below 1); otherwise it
    is multiplied every ``window`` iterations counted from the last overflow."""
    if overflow:
        return max(scale / factor, 1), iteration
    if (iteration - last_overflow) % window == 0:
        return scale * factor, last_overflow
    return scale, last_overflow


class LossScaler:
    """A fixed loss scale: ``backward(loss)`` runs backward on ``loss * scale``."""

    def __init__(self, scale=1):
        self.cur_scale = scale

    @property
    def loss_scale(self):
        return self.cur_scale

    def has_overflow(self, params):
        return False  # a fixed scale never reacts to one

    @staticmethod
    def _has_inf_or_nan(x):
        return False

    def update_scale(self, overflow):
        pass

    def scale_gradient(self, module, grad_in, grad_out):
        return tuple(self.loss_scale * g for g in grad_in)

    def backward(self, loss, retain_graph=False):
        (loss * self.loss_scale).backward(retain_graph=retain_graph)


class DynamicLossScaler(LossScaler):
    """A loss scale that is divided by ``scale_factor`` (never below 1) after an
    iteration whose grads overflowed and multiplied by it every ``scale_window``
    iterations since the last overflow. ``has_overflow(params)`` tells; the caller
    skips the step and calls ``update_scale(overflow)`` every iteration."""

    def __init__(self, init_scale=2**32, scale_factor=2.0, scale_window=1000):
        super().__init__(init_scale)
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.scale_factor = scale_factor
        self.scale_window = scale_window

    def has_overflow(self, params):
        return _grads_overflow(params)

    @staticmethod
    def _has_inf_or_nan(x):
        return not bool(torch.isfinite(x).all())

    def update_scale(self, overflow):
        self.cur_scale, self.last_overflow_iter = windowed_update(
            self.cur_scale, self.scale_factor, self.scale_window, self.cur_iter, self.last_overflow_iter, overflow)
        self.cur_iter += 1
