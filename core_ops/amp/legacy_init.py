"""Apex's ``amp.init()``, the mixed-precision API from before ``amp.initialize``:

    handle = amp.init()                      # O1 casts on, process-wide
    with handle.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()               # grads unscaled on leaving; an overflow
    optimizer.step()                         # makes this one step do nothing
    handle._deactivate()                     # casts off

While the handle is active, Apex's O1 cast lists apply to every torch call
(``apex_casts.ApexCasts``) and ``torch.autocast`` is on for CPU and CUDA in the half
dtype, without its weight cache. Where the two disagree, Apex's lists win for the
functions they name; everything else gets autocast's rule (``AUTOCAST_DIFFERENCES``).
"""

from __future__ import annotations

import contextlib

import torch

from ..multi_tensor_apply import multi_tensor_scale
from ..settings import INIT_LOSS_SCALE
from . import _state
from .apex_casts import ApexCasts
from .loss_scaler import LossScaler

# Ops that Apex's lists leave alone but autocast casts while amp.init() is active
# (documented, not changed: the ops are autocast's, which modern torch code expects).
AUTOCAST_DIFFERENCES = (
    "scaled_dot_product_attention and the attention ops run in half (autocast); Apex predates them.",
    "On CPU, autocast runs in float32 some ops Apex kept in the input's dtype: max_pool3d, "
    "avg_pool3d, adaptive_avg_pool3d, the reflection / replication pads, grid_sampler, stft, the "
    "fft and linalg families, cdist, trace, quantile.",
)

def _devices():
    """The device types to autocast: CPU, and CUDA where a GPU is present."""
    return ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)


class DisabledInitHandle:
    """The handle of ``amp.init(enabled=False)``: no casts, no loss scaling (Apex's
    ``NoOpHandle``); ``AmpHandle`` takes its defaults."""

    def is_active(self):
        return False

    @contextlib.contextmanager
    def _disable_casts(self):
        yield

    @contextlib.contextmanager
    def scale_loss(self, loss, optimizer):
        yield loss

    def wrap_optimizer(self, optimizer, num_loss=1):
        return optimizer

    def _clear_cache(self):
        pass

    def _deactivate(self):
        pass

    @property
    def has_cache(self):
        return False

    @property
    def verbose(self):
        return False


class AmpHandle(DisabledInitHandle):
    """The casts of one ``amp.init()`` call and its loss scale (module doc)."""

    def __init__(self, loss_scale="dynamic", verbose=False, allow_banned=False, half_dtype=torch.float16):
        dynamic = loss_scale == "dynamic"
        if not dynamic and not (isinstance(loss_scale, (int, float)) and loss_scale > 0):
            raise ValueError(f"loss_scale must be 'dynamic' or a number > 0, got {loss_scale!r}")
        self._scaler = LossScaler(init_scale=INIT_LOSS_SCALE if dynamic else float(loss_scale), dynamic=dynamic)
        self._verbose = verbose
        self._casts = ApexCasts(half_dtype, allow_banned)
        self._autocasts = [torch.autocast(d, dtype=half_dtype, cache_enabled=False) for d in _devices()]
        self._active = False
        self.cache = {}  # Apex's cast cache; casts are not cached here (apex_casts)

    def _activate(self):
        for autocast in self._autocasts:
            autocast.__enter__()
        self._casts.__enter__()
        self._active = True

    def is_active(self):
        return self._active

    @property
    def verbose(self):
        return self._verbose

    def _deactivate(self):
        """Ends the casts (idempotent). Casts entered after this handle's must have
        ended first: the modes and autocast form a stack."""
        if not self._active:
            return
        self._active = False
        self._casts.__exit__(None, None, None)
        for autocast in reversed(self._autocasts):
            autocast.__exit__(None, None, None)
        if _state.legacy_handle() is self:
            _state.set_legacy_handle(None)

    @contextlib.contextmanager
    def _disable_casts(self):
        """A block with neither Apex's casts nor autocast."""
        paused, self._casts.paused = self._casts.paused, True
        try:
            with contextlib.ExitStack() as stack:
                for d in _devices():
                    stack.enter_context(torch.autocast(d, enabled=False))
                yield
        finally:
            self._casts.paused = paused

    @contextlib.contextmanager
    def scale_loss(self, loss, optimizer):
        """Yields ``loss`` times the scale; on leaving, the grads of ``optimizer``'s
        params are unscaled in place, the scale is updated, and after an overflow the
        optimizer's next ``step()`` does nothing."""
        if not self._active:
            yield loss
            return
        scale = self._scaler.scale_tensor(loss.device)
        yield loss.float() * scale
        groups = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    groups.setdefault((p.grad.device, p.grad.dtype), []).append(p.grad)
        found = torch.zeros((), device=scale.device)
        for (device, _), grads in groups.items():
            inv = torch.reciprocal(scale.double()).float().to(device)
            found = torch.maximum(found, multi_tensor_scale(grads, grads, inv).reshape(()).to(found.device))
        self._scaler.update_from(found)
        if bool(found.item()):
            _skip_next_step(optimizer, self._scaler.get_scale(), self._verbose)

    def wrap_optimizer(self, optimizer, num_loss=1):
        raise NotImplementedError("handle.wrap_optimizer (Apex's multi-loss OptimWrapper) is not provided: "
                                  "use amp.initialize(model, optimizer, opt_level='O1', num_losses=N) and "
                                  "amp.scale_loss(loss, optimizer, loss_id=i)")

    @property
    def loss_scale(self):
        return self._scaler.get_scale()


def _skip_next_step(optimizer, new_scale, verbose):
    step = optimizer.step

    def skipped_step(*args, **kwargs):
        if verbose:
            print(f"Gradient overflow, skipping update; loss scale reduced to {new_scale}")
        optimizer.step = step  # the instance attribute goes; the class's step is back
        del optimizer.step
        return None

    optimizer.step = skipped_step


def init(enabled=True, loss_scale="dynamic", enable_caching=True, verbose=False, allow_banned=False,
         half_dtype=torch.float16):
    """Apex's ``amp.init``: turns Apex's O1 casts on for the whole process and returns
    the handle (module doc); ``enabled=False`` returns a handle that does nothing.
    ``enable_caching`` is accepted (casts are not cached). ``half_dtype`` may be
    bfloat16, beyond Apex."""
    if not enabled:
        return DisabledInitHandle()
    if half_dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"half_dtype must be torch.float16 or torch.bfloat16, got {half_dtype}")
    previous = _state.legacy_handle()
    if previous is not None:
        previous._deactivate()  # Apex re-patched over its earlier patching: one set of casts
    handle = AmpHandle(loss_scale, verbose, allow_banned, half_dtype)
    handle._activate()
    _state.set_legacy_handle(handle)
    return handle
