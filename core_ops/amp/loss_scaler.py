"""The dynamic loss scaler: Apex's ``LossScaler`` and a drop-in ``torch.amp.GradScaler``
in one object, with the scale, its trackers and the overflow flag kept on the device.

Note [Host syncs of loss scaling]: the scale is multiplied into the loss as a tensor,
the overflow check is a multi-tensor op writing a device flag, and the scale update is
``update_scale_`` on that flag, so nothing waits for the device. The only sync is
where a plain ``torch.optim`` optimizer must be told on the host whether to step (one
``.item()`` per step); a fused optimizer (core_ops' or torch's ``fused=True``, both
``_step_supports_amp_scaling``) reads the flag inside its kernel and skips by itself.
Reading ``get_scale()`` or ``skipped_steps`` syncs, on purpose, for logging.
"""

from __future__ import annotations

import enum
import math
import warnings
from collections import defaultdict
from collections.abc import Iterable, Mapping

import torch

from .. import _validate
from ..multi_tensor_apply import multi_tensor_check_finite, multi_tensor_scale, update_scale
from .._sharded import local, max_over_meshes, meshes_of
from ..settings import INIT_LOSS_SCALE
from ..optimizers._base import FusedOptimizer


class _Stage(enum.Enum):
    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _grads_by_device_dtype(optimizer):
    """(grads of ``optimizer``'s params grouped by (device, dtype), the device meshes
    of its sharded grads). Sparse grads are coalesced and contribute their values (as
    torch.amp.GradScaler does); DTensor grads (FSDP2) contribute their local shards,
    and the overflow flag is then reduced over their meshes (``max_over_meshes``)."""
    groups, grads = defaultdict(list), []
    for group in optimizer.param_groups:
        for p in group["params"]:
            g = p.grad
            if g is None:
                continue
            grads.append(g)
            g = local(g)
            if g.is_sparse:
                if g.dtype is torch.float16:
                    g = p.grad = g.coalesce()  # fp16 sums of duplicates could overflow
                g = g._values()
            groups[(g.device, g.dtype)].append(g)
    return groups, meshes_of(grads)


def _fresh_optimizer_state():
    return {"stage": _Stage.READY, "found_inf": None}


def _device_of(value):
    if isinstance(value, torch.Tensor):
        return value.device
    if isinstance(value, (list, tuple)):
        for v in value:
            d = _device_of(v)
            if d is not None:
                return d
    return None


def load_saved_at_level(scaler, saved, saved_level, level, name="its loss scaler"):
    """Loads ``saved`` (a scaler's state dict, maybe empty) into ``scaler`` when the
    state was saved at ``level``; from another level it warns, and loads only where both
    scale dynamically or both statically (a resume at O1 from an O2 run). Shared by
    ``AmpLoop.load_state_dict`` (the plugins) and ``amp.load_state_dict``."""
    if saved_level != level:
        same_kind = bool(saved.get("dynamic", scaler.dynamic)) == scaler.dynamic
        warnings.warn(f"loading the amp state of an {saved_level} run into {level}: {name} "
                      + ("carries over" if same_kind and saved else "does not apply here and is left out"),
                      stacklevel=3)
        if not same_kind:
            return
    if saved:
        scaler.load_state_dict(saved)


class LossScaler:
    """Dynamic (or static) loss scaling with no per-parameter host sync.

    As ``torch.amp.GradScaler``: ``scale(loss)``, ``unscale_(opt)``, ``step(opt)``,
    ``update()``, ``get_scale()``, ``state_dict()`` / ``load_state_dict()`` (which also
    read Apex's ``{'loss_scale', 'unskipped'}`` format). Beyond it: ``min_scale`` /
    ``max_scale`` bounds, ``hysteresis`` (overflows in a row tolerated before backing
    off), ``dynamic=False`` for a fixed scale that still skips overflowed steps, and
    ``skipped_steps``. ``device`` may be None: the scaler then lives on the device of
    the first loss it scales.

    Overflow, for an optimizer that unscales inside its step (fused): an inf or nan
    element in the scaled grads, tested element by element as torch's GradScaler does
    (a finite grad whose square overflows is not an overflow). Fused optimizers that
    take norms of the scaled grads (LAMB's clipping, NovoGrad's layer norms) add a
    non-finite norm to the flag themselves.
    """

    def __init__(self, device=None, init_scale=INIT_LOSS_SCALE, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, enabled=True, *, dynamic=True, min_scale=0.0,
                 max_scale=math.inf, hysteresis=1):
        if not init_scale > 0 or not math.isfinite(init_scale):
            raise ValueError(f"init_scale must be a finite number > 0, got {init_scale}")
        _validate.loss_scale_args(growth_factor, backoff_factor, growth_interval, hysteresis,
                                  min_scale, max_scale)
        self._device = None if device is None else torch.device(device)
        self._init_scale = float(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._enabled = bool(enabled)
        self.dynamic = bool(dynamic)
        self.min_scale = float(min_scale)
        self.max_scale = float(max_scale)
        self.hysteresis = int(hysteresis)
        self._scale = None  # created lazily on the device, as GradScaler does
        self._pending = None  # a loaded state dict waiting for the device
        self._overflow_buf = None  # Apex's flag for update_scale(); see there
        self._per_optimizer = defaultdict(_fresh_optimizer_state)

    def __getstate__(self):
        # As torch's GradScaler: the per-optimizer records are keyed by id(), which
        # means nothing in another process, so only a scaler between iterations pickles.
        if self._per_optimizer:
            raise RuntimeError("a LossScaler can be pickled only between iterations: before its "
                               "first scale() or after update()")
        return dict(self.__dict__)

    # ---- device state -------------------------------------------------------------

    def _lazy_init(self, device):
        if self._scale is not None:
            return
        device = torch.device(device if self._device is None else self._device)
        self._device = device
        self._scale = torch.full((), self._init_scale, dtype=torch.float32, device=device)
        self._growth_tracker = torch.zeros((), dtype=torch.int32, device=device)
        self._hysteresis_tracker = torch.full((), self.hysteresis, dtype=torch.int32, device=device)
        self._skipped = torch.zeros((), dtype=torch.int64, device=device)
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self.load_state_dict(pending)

    def scale_tensor(self, device=None):
        """The current scale as a 0-d float32 tensor (no host sync)."""
        self._lazy_init(device or self._device or "cpu")
        return self._scale if device is None else self._scale.to(device, non_blocking=True)

    # ---- torch.amp.GradScaler API ---------------------------------------------------

    def is_enabled(self):
        return self._enabled

    def scale(self, outputs):
        """``outputs`` (a tensor or nested lists/tuples of them) times the scale."""
        if not self._enabled:
            return outputs
        if (not isinstance(outputs, (torch.Tensor, list, tuple, Mapping, str))
                and isinstance(outputs, Iterable)):
            return iter(self.scale(list(outputs)))  # a generator, as GradScaler.scale takes
        device = _device_of(outputs)
        if device is None:
            raise TypeError(f"scale() expects a tensor or a list/tuple of tensors, got "
                            f"{type(outputs).__name__}")
        self._lazy_init(device)

        def apply(v):
            if isinstance(v, torch.Tensor):
                return v * self._scale.to(v.device, non_blocking=True)
            if isinstance(v, (list, tuple)):
                return type(v)(apply(x) for x in v)
            raise TypeError(f"scale() expects tensors, got {type(v).__name__}")
        return apply(outputs)

    def _record_found(self, state, found):
        found = found.reshape(()).to(self._device, non_blocking=True)
        state["found_inf"] = found if state["found_inf"] is None else torch.maximum(state["found_inf"], found)

    def _inv_scale(self, device):
        return torch.reciprocal(self._scale.double()).float().to(device, non_blocking=True)

    def unscale_(self, optimizer):
        """Divides ``optimizer``'s grads by the scale in place (one multi-tensor pass per
        (device, dtype), which also sets the overflow flag), e.g. before clipping."""
        if not self._enabled:
            return
        state = self._per_optimizer[id(optimizer)]
        if state["stage"] is _Stage.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the "
                               "last update()")
        if state["stage"] is _Stage.STEPPED:
            raise RuntimeError("unscale_() is being called after step(); call update() first")
        self._lazy_init(self._first_grad_device(optimizer))
        found = torch.zeros((), dtype=torch.float32, device=self._device)
        groups, meshes = _grads_by_device_dtype(optimizer)
        for (device, _), grads in groups.items():
            flag = multi_tensor_scale(grads, grads, self._inv_scale(device))
            found = torch.maximum(found, flag.reshape(()).to(self._device, non_blocking=True))
        self._record_found(state, max_over_meshes(found, meshes))
        state["stage"] = _Stage.UNSCALED

    def _check(self, optimizer):
        """The overflow flag of the still-scaled grads: one read-only pass that tests
        every element, as torch's unscale_ does (a norm would also flag finite grads
        whose squares overflow)."""
        found = torch.zeros((), dtype=torch.float32, device=self._device)
        groups, meshes = _grads_by_device_dtype(optimizer)
        for grads in groups.values():
            flag = multi_tensor_check_finite(grads)
            found = torch.maximum(found, flag.reshape(()).to(self._device, non_blocking=True))
        return max_over_meshes(found, meshes)

    def _first_grad_device(self, optimizer):
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    return p.grad.device
        return self._device or "cpu"

    def step(self, optimizer, *args, **kwargs):
        """``optimizer.step(*args, **kwargs)`` unless the grads overflowed. A fused
        optimizer unscales and skips inside its kernel (no host sync); any other is
        unscaled first and stepped only if the flag is clear (one host sync)."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        # A closure given as None is no closure: Accelerate calls step(optimizer, None).
        if kwargs.get("closure", args[0] if args else None) is not None:
            raise RuntimeError("closures are not supported with loss scaling: the closure would "
                               "run backward after the overflow check")
        state = self._per_optimizer[id(optimizer)]
        if state["stage"] is _Stage.STEPPED:
            raise RuntimeError("step() has already been called on this optimizer since the last "
                               "update()")
        self._lazy_init(self._first_grad_device(optimizer))
        if isinstance(optimizer, FusedOptimizer):
            # core_ops' optimizers take the scale and the flag as arguments: nothing is set
            # on the optimizer, which torch 2.9's torch.compile refuses outright.
            grad_scale = None
            if state["stage"] is _Stage.READY:
                self._record_found(state, self._check(optimizer))
                grad_scale = self._scale
            result = optimizer.step(grad_scale=grad_scale, found_inf=state["found_inf"], **kwargs)
        elif getattr(optimizer, "_step_supports_amp_scaling", False):
            if state["stage"] is _Stage.READY:
                self._record_found(state, self._check(optimizer))
                optimizer.grad_scale = self._scale
            else:
                optimizer.grad_scale = None
            optimizer.found_inf = state["found_inf"]  # 0-d, as torch's fused optimizers expect
            try:
                result = optimizer.step(**kwargs)
            finally:
                del optimizer.grad_scale, optimizer.found_inf
        else:
            if state["stage"] is _Stage.READY:
                self.unscale_(optimizer)
            result = None if state["found_inf"].item() else optimizer.step(**kwargs)
        state["stage"] = _Stage.STEPPED
        return result

    def update(self, new_scale=None):
        """Grows or backs off the scale from the overflow flags of this iteration's
        optimizers (on the device), or sets it to ``new_scale``."""
        if not self._enabled:
            return
        if new_scale is not None:
            self._lazy_init(self._device or "cpu")
            if isinstance(new_scale, torch.Tensor):
                self._scale.copy_(new_scale.reshape(()))
            else:
                self._scale.fill_(float(new_scale))
            if not self.dynamic:
                self._init_scale = float(new_scale)
        else:
            flags = [s["found_inf"] for s in self._per_optimizer.values() if s["found_inf"] is not None]
            if not flags:
                raise RuntimeError("update() found no overflow checks: call step() or unscale_() "
                                   "on an optimizer with gradients first")
            found = flags[0]
            for f in flags[1:]:
                found = torch.maximum(found, f)
            self.update_from(found)
        self._per_optimizer.clear()

    def update_from(self, found_inf):
        """The scale update for one overflow flag (the amp front end's entry point)."""
        self._lazy_init(found_inf.device)
        found_inf = found_inf.to(self._device, non_blocking=True)
        if self.dynamic:
            update_scale(self._scale, self._growth_tracker, found_inf,
                         growth_factor=self._growth_factor, backoff_factor=self._backoff_factor,
                         growth_interval=self._growth_interval, hysteresis=self.hysteresis,
                         hysteresis_tracker=self._hysteresis_tracker, min_scale=self.min_scale,
                         max_scale=self.max_scale)
        self._skipped += (found_inf.reshape(()) > 0).to(torch.int64)

    def get_scale(self):
        """The current scale as a float (a host sync); 1.0 when disabled."""
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else float(self._scale)

    loss_scale = get_scale  # Apex's name

    # ---- Apex's LossScaler internals, which scripts reach into -----------------------

    @property
    def _loss_scale(self):
        return self.get_scale()

    @_loss_scale.setter
    def _loss_scale(self, value):
        # NVIDIA's BERT sets amp._amp_state.loss_scalers[0]._loss_scale at start-up.
        self._init_scale = float(value)
        if self._scale is not None:
            self._scale.fill_(float(value))

    def update_scale(self):
        """Apex's: the scale update for ``_overflow_buf`` (set by the ``scale_loss``
        calls with ``delay_overflow_check=True`` since the last update, or by the
        caller), which it then clears; returns whether the step should be skipped (a
        host sync, as in Apex)."""
        flag = self._overflow_buf
        found = torch.zeros((), device=self._device or "cpu") if flag is None else (flag != 0).float()
        self.update_from(found.reshape(()))
        self.clear_overflow_state()  # the flag covered the calls since the last update
        return bool(found.item()) and self.dynamic

    def note_overflow(self, found_inf):
        """ORs ``found_inf`` into ``_overflow_buf`` for the next ``update_scale()`` (the
        flags of ``scale_loss(..., delay_overflow_check=True)`` calls)."""
        flag = (found_inf > 0).to(torch.int32).reshape(1)
        held = self._overflow_buf
        self._overflow_buf = flag if held is None else torch.maximum(held, flag.to(held.device))

    def clear_overflow_state(self):
        if self._overflow_buf is not None:
            self._overflow_buf.zero_()

    @property
    def fixed_scale(self):
        """The scale of a static scaler, known on the host (None when dynamic)."""
        return None if self.dynamic else self._init_scale

    @property
    def skipped_steps(self):
        """How many updates saw an overflow (a host sync)."""
        return 0 if self._scale is None else int(self._skipped)

    def get_growth_factor(self):
        return self._growth_factor

    def set_growth_factor(self, value):
        self._growth_factor = float(value)

    def get_backoff_factor(self):
        return self._backoff_factor

    def set_backoff_factor(self, value):
        self._backoff_factor = float(value)

    def get_growth_interval(self):
        return self._growth_interval

    def set_growth_interval(self, value):
        self._growth_interval = int(value)

    # ---- state dicts ------------------------------------------------------------------

    def state_dict(self):
        """torch.amp.GradScaler's keys, plus this scaler's bounds and hysteresis."""
        if not self._enabled:
            return {}
        initialized = self._scale is not None
        pending = self._pending or {}
        return {
            "scale": self.get_scale(),
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": int(self._growth_tracker) if initialized else int(
                pending.get("_growth_tracker", 0)),
            "dynamic": self.dynamic,
            "min_scale": self.min_scale,
            "max_scale": self.max_scale,
            "hysteresis": self.hysteresis,
            "_hysteresis_tracker": int(self._hysteresis_tracker) if initialized else int(
                pending.get("_hysteresis_tracker", self.hysteresis)),
            "skipped_steps": self.skipped_steps if initialized else int(pending.get("skipped_steps", 0)),
        }

    def load_state_dict(self, state_dict):
        """Loads torch.amp.GradScaler's format, this scaler's, or Apex's
        (``{'loss_scale': ..., 'unskipped': ...}``)."""
        if not self._enabled:
            return
        if not state_dict:
            raise RuntimeError("the state dict is empty: it was saved from a disabled scaler")
        if "loss_scale" in state_dict:  # Apex
            state_dict = {"scale": state_dict["loss_scale"], "_growth_tracker": state_dict["unskipped"],
                          **{k: v for k, v in state_dict.items() if k not in ("loss_scale", "unskipped")}}
        if "scale" not in state_dict:
            raise KeyError(f"not a loss scaler state dict: keys {sorted(state_dict)}")
        self._init_scale = float(state_dict["scale"])
        self._growth_factor = float(state_dict.get("growth_factor", self._growth_factor))
        self._backoff_factor = float(state_dict.get("backoff_factor", self._backoff_factor))
        self._growth_interval = int(state_dict.get("growth_interval", self._growth_interval))
        self.dynamic = bool(state_dict.get("dynamic", self.dynamic))
        self.min_scale = float(state_dict.get("min_scale", self.min_scale))
        self.max_scale = float(state_dict.get("max_scale", self.max_scale))
        self.hysteresis = int(state_dict.get("hysteresis", self.hysteresis))
        if self._scale is None:
            self._pending = dict(state_dict)  # applied on the device once it is known
            return
        self._scale.fill_(self._init_scale)
        self._growth_tracker.fill_(int(state_dict.get("_growth_tracker", 0)))
        self._hysteresis_tracker.fill_(int(state_dict.get("_hysteresis_tracker", self.hysteresis)))
        self._skipped.fill_(int(state_dict.get("skipped_steps", 0)))


GradScaler = LossScaler
