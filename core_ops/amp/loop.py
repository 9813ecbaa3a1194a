"""``AmpLoop``: core_ops.amp for a training loop that a framework owns (Lightning's
Trainer and Fabric, Accelerate). The model is prepared first, before any data-parallel
wrapping; the optimizers are attached once they exist; each step then follows
torch.amp.GradScaler's protocol, with Apex's opt levels and fp32 master weights::

    loop = AmpLoop("O2", half_dtype=torch.float16)
    model = loop.prepare_model(model)         # cast, fp32 masters (before DDP wraps it)
    optimizer = loop.attach(optimizer)         # the optimizer now steps the masters
    (loop.scale(loss)).backward()              # grads of the half params, scaled
    loop.unscale_(optimizer)                   # into the masters' grads; inf/nan check
    loop.clip_grad_norm_(optimizer, 1.0)       # optional: the true norm, one pass
    loop.step(optimizer)                       # skipped on overflow, nothing changed
    loop.update()                              # the loss scale, on the device

It runs on the pieces of ``initialize`` / ``scale_loss`` (the model preparation,
``AmpOptimizer``, ``LossScaler``), so both behave alike: the same casts, masters, skips
and accumulation rules. ``unscale_`` may run after every backward (grads then
accumulate in float32 in the masters, as under ``scale_loss``) or once before the step
(they accumulate scaled, in the half dtype, as Apex's ``delay_unscale``: what a
backward inside DDP's ``no_sync()`` needs, since only reduced grads may reach the
masters). With a fused optimizer nothing syncs the host, as under ``scale_loss``.
"""

from __future__ import annotations

import contextlib
import weakref

import torch

from .. import settings
from .._forwarding import forwarded
from ..multi_tensor_apply import clip_grad_norm_ as _clip_grads
from ..torch_patches import ddp_init_broadcast
from . import opt_levels
from .amp_optimizer import AmpOptimizer
from .preparation import (check_half_supported, check_models, make_masters, make_state, prepare_model, publish,
                          remainder_seeds, uncompiled)
from .loss_scaler import load_saved_at_level
from .masters import HALF, MasterWeights
from .masters import of as masters_of
from .skip_watch import describe_grads, grad_report, named_amp_grads
from .model_casting import module_device_type

class AmpLoop:
    """Apex's ``opt_level`` (O0-O3) and ``half_dtype`` (fp16 or bf16), with the options
    of ``initialize`` (the amp settings of ``core_ops.settings`` and Apex's own
    ``cast_model_type``, ``patch_torch_functions``, ``cast_model_outputs``), for a loop
    driven by ``scale`` / ``unscale_`` / ``step`` / ``update``. Each setting left None
    takes its ``CORE_OPS_*`` variable, else its default; a framework's plugin passes
    ``routed``, its own ``settings.resolve`` (its defaults, and errors that name the
    route each value came from). Bad options raise here, at construction."""

    def __init__(self, opt_level=None, half_dtype=None, routed=None, **options):
        apex_only = {k: options.pop(k) for k in opt_levels.APEX_ONLY if k in options}
        if routed is None:
            try:
                routed = settings.resolve("amp", dict(opt_level=opt_level, half_dtype=half_dtype, **options),
                                          also=opt_levels.APEX_ONLY)
            except TypeError as e:
                raise TypeError(f"AmpLoop got {e}") from None
        elif opt_level is not None or half_dtype is not None or options:
            raise TypeError("AmpLoop takes its settings either as arguments or as routed, not both")
        self.routed = routed
        self.properties = props = opt_levels.from_settings(routed, **apex_only)
        self.state = make_state(props, routed=routed)
        self.scaler, self.handle, self.watch = self.state.loss_scalers[0], self.state.handle, self.state.watches[0]
        self.registry = MasterWeights()
        self.seeds = {}  # master_weights="remainder": see preparation.remainder_seeds
        self._found = None  # overflow flag of the unscales since the last update()
        self._scaled_since_update = False  # grads of an optimizer attached late are scaled too
        self._device_type = None

    opt_level = forwarded("properties", "opt_level")
    half_dtype = forwarded("properties", "half_dtype")

    @property
    def casts_model(self):
        """Whether the model's weights are half (O2, O3)."""
        return self.properties.cast_model_type in HALF

    # ---- setting up ---------------------------------------------------------------

    def prepare_model(self, model):
        """Casts ``model`` in place as ``initialize`` would (O2: half weights, BatchNorm
        kept float32, fp32 masters made from the float32 weights first, outputs cast to
        float32; O1: forward under autocast) and returns it. At O2 / O3 each module
        holding half params casts its floating inputs (``cast_inputs_of_half_modules``),
        so a batch's targets stay as they are and submodules called directly take
        float32 tensors. Call it before any DDP wrapping: the masters then follow DDP's
        broadcast (Note [Masters follow DDP's broadcast]). A ``torch.compile``d model is
        prepared through the module it wraps, and returned as given."""
        given, model = model, uncompiled(model)
        if model is not given:
            self.prepare_model(model)
            return given
        if any(ref() is model for ref in self.state.models):
            return model
        if getattr(model, "_core_ops_amp", None) is not None:
            return self._adopt(model)
        device_type = check_models([model])
        check_half_supported(device_type, self.properties)
        self._device_type = self._device_type or device_type
        if self.properties.remainders:
            self.seeds.update(remainder_seeds([model], self.properties))
        if self.properties.fp32_masters:
            make_masters([model], self.properties, self.registry)
            if len(self.registry):
                ddp_init_broadcast.install()
        prepare_model(model, self.properties, self.registry, self.handle, inputs_per_module=True)
        self.state.models.append(weakref.ref(model))
        return model

    def _adopt(self, model):
        """A model another AmpLoop (a Trainer before this one: fit, then test with a new
        Trainer) or ``initialize`` prepared at the same settings is taken as it is, its
        masters with it; at other settings it cannot be cast again."""
        if model._core_ops_amp != self.properties:
            raise RuntimeError(f"this model was prepared for amp at {model._core_ops_amp.opt_level} with "
                               f"{model._core_ops_amp.half_dtype} (by an earlier AmpLoop, Trainer or "
                               f"amp.initialize) and cannot be cast again for {self.opt_level} with "
                               f"{self.half_dtype}: build a fresh model (and load the checkpoint) for "
                               "other settings")
        for key, entry in masters_of(model)._by_id.items():
            self.registry._by_id.setdefault(key, entry)
        self._device_type = self._device_type or module_device_type(model)
        self.state.models.append(weakref.ref(model))
        return model

    def attach(self, optimizer):
        """Makes ``optimizer`` step the masters of the prepared models' half params (its
        param groups take them in place) and skip overflowed steps; returns it. Once
        per optimizer; params of models this loop did not prepare stay as they are."""
        amp = getattr(optimizer, "_core_ops_amp", None)
        if amp is not None:
            if amp.state is not self.state:
                raise RuntimeError("this optimizer already belongs to another amp.initialize or "
                                   "AmpLoop; give each optimizer to one")
            return optimizer
        masters = self.registry if self.properties.fp32_masters else None
        amp = optimizer._core_ops_amp = AmpOptimizer(optimizer, masters, self.state)
        if self.properties.remainders:
            amp.keep_remainders(self.seeds)
        # Fabric attaches an optimizer at its first step, after the backward passes.
        amp.params_have_scaled_gradients = self._scaled_since_update and self.scaling
        self.state.optimizers.append(weakref.ref(optimizer))
        publish(self.state)  # amp.loss_scale(), amp._amp_state read this loop
        return optimizer

    def _amps(self):
        return [opt._core_ops_amp for ref in self.state.optimizers if (opt := ref()) is not None]

    def _amp(self, optimizer):
        return self.attach(optimizer)._core_ops_amp

    # ---- forward --------------------------------------------------------------------

    def autocast(self, device_type=None):
        """O1's ``torch.autocast`` for a block (a whole training step); elsewhere nothing."""
        if not self.properties.patch_torch_functions or not self.handle.is_active():
            return contextlib.nullcontext()
        return torch.autocast(device_type or self._device_type or "cpu", dtype=self.half_dtype)

    # ---- one iteration -------------------------------------------------------------

    @property
    def scaling(self):
        """Whether losses are scaled (dynamic or a static scale other than 1) or grads
        go through masters or are checked (skip_nonfinite); O0 and O3 with loss scale 1
        do none of these by default, as in Apex."""
        return (self.properties.fp32_masters or self.scaler.dynamic or self.scaler.fixed_scale != 1.0
                or self.properties.skip_nonfinite)

    def scale(self, loss):
        """``loss`` in float32 times the loss scale, to call ``backward`` on. The first
        backward since the last ``unscale_`` scales the float32 grads already there
        (Note [Accumulating under amp])."""
        if not self.scaling:
            return loss
        scale = self.scaler.scale_tensor(loss.device)
        self._scaled_since_update = True
        for amp in self._amps():
            amp.adopt_written_weights()
            if not amp.params_have_scaled_gradients:
                amp.prepare_backward(scale)
                amp.params_have_scaled_gradients = True
        return loss.float() * scale

    def unscale_(self, optimizer):
        """The grads of ``optimizer``'s params unscaled (O2: the half grads into the
        masters' float32 grads, then dropped) and checked for inf / nan, once per
        backward; returns the overflow flag of this iteration (on the device)."""
        amp = self._amp(optimizer)
        if self.scaling and amp.params_have_scaled_gradients:
            scale = self.scaler.scale_tensor()
            found = amp.post_backward(scale)
            amp.params_have_scaled_gradients = False
            self._found = found if self._found is None else torch.maximum(self._found, found)
        return amp.found_inf

    def main_params(self, target):
        """The params that ``target`` (an optimizer, or params such as
        ``model.parameters()``) trains: a half param's fp32 master in its place."""
        if hasattr(target, "param_groups"):
            return [p for g in target.param_groups for p in g["params"]]
        return [p if (m := self.registry.get(p)) is None else m for p in target]

    def clip_grad_norm_(self, target, max_norm):
        """Clips the grads of ``target`` (an optimizer, or params such as
        ``model.parameters()``: a half param's master stands in for it), unscaled first
        (every attached optimizer's, for params), by their global L2 norm in one norm
        pass (``core_ops.clip_grad_norm_``); returns the true norm. A norm that
        overflows float32 although every grad is finite skips the step, as an overflow
        does."""
        on_optimizer = hasattr(target, "param_groups")
        amps = [self._amp(target)] if on_optimizer else self._amps()
        for amp in amps:
            self.unscale_(amp.optimizer)
        grads = [p.grad for p in self.main_params(target) if p.grad is not None and not p.grad.is_sparse]
        if not grads:
            return torch.zeros(())
        norm = _clip_grads(grads, max_norm)
        if self.scaling:
            bad = (~torch.isfinite(norm)).float().reshape(1).to(self.scaler.scale_tensor().device)
            for amp in amps:
                amp.found_inf = bad if amp.found_inf is None else torch.maximum(amp.found_inf, bad)
            self._found = bad if self._found is None else torch.maximum(self._found, bad)
        return norm

    def step(self, optimizer, *args, **kwargs):
        """``optimizer.step(*args, **kwargs)`` after ``unscale_``; an overflow this
        iteration makes it change nothing (params, masters, state, step counts)."""
        self.unscale_(optimizer)
        return optimizer.step(*args, **kwargs)

    def step_was_skipped(self, optimizer):
        """Whether ``optimizer``'s last step was skipped for overflow (a host sync)."""
        flag = self._amp(optimizer).last_found_inf
        return bool(flag is not None and flag.item() > 0)

    def follow_skips(self, scheduler):
        """Makes ``scheduler.step()`` do nothing right after a skipped step of its
        optimizer, so that an overflow does not advance the schedule (torch's AMP
        advances it anyway). Its class is swapped for a subclass that checks first (one
        host sync per scheduler step); its state dict is unchanged, and a copy or a
        pickle of it is the plain scheduler. Returns it."""
        cls = type(scheduler)
        if not getattr(cls, "_core_ops_follows_skips", False):
            scheduler.__class__ = _following(cls)
        _FOLLOWED[scheduler] = self
        return scheduler

    def update(self):
        """Backs the loss scale off after an overflowed iteration, grows it after
        ``growth_interval`` clean ones (on the device, no sync)."""
        found, self._found = self._found, None
        self._scaled_since_update = False
        if found is not None and self.scaling:
            self.scaler.update_from(found)
            if self.watch.active:
                self.watch.observe(found, lambda: describe_grads(self.state, self._amps()), self.scaler)

    def grad_report(self):
        """Each param's grad now, by name: ``{name, shape, numel, nonfinite,
        max_abs_finite}`` dicts (``amp.grad_report``'s; host syncs)."""
        return grad_report(named_amp_grads(self.state, self._amps()))

    # ---- reading and saving ---------------------------------------------------------

    @property
    def loss_scale(self):
        """The current loss scale as a float (a host sync)."""
        return self.scaler.get_scale()

    @property
    def skipped_steps(self):
        """Iterations skipped for overflow so far (a host sync)."""
        return self.scaler.skipped_steps

    def counters(self):
        """(loss scale, skipped steps) as 0-d float32 device tensors, for loggers that
        read them later: no host sync here."""
        if self.scaler._scale is None:  # no loss scaled yet
            return torch.tensor(self.scaler.get_scale()), torch.zeros(())
        scale = self.scaler.scale_tensor().detach().reshape(()).clone()
        return scale, self.scaler._skipped.detach().reshape(()).float()

    def state_dict(self):
        return {"opt_level": self.opt_level, "loss_scaler": self.scaler.state_dict()}

    def load_state_dict(self, state_dict):
        """The loss scaler of ``state_dict()``. One saved at another level loads too (a
        resume at O1 from an O2 run), its scaler only where both scale dynamically or
        both statically, with a warning either way."""
        load_saved_at_level(self.scaler, state_dict.get("loss_scaler") or {},
                            state_dict.get("opt_level", self.opt_level), self.opt_level)


# Schedulers that follow an AmpLoop's skips (weakly: a scheduler ends with its loop run).
_FOLLOWED = weakref.WeakKeyDictionary()
_FOLLOWING = {}


def _following(cls):
    """``cls`` with a step() that skips after a skipped optimizer step (one per class)."""
    if cls not in _FOLLOWING:
        def step(self, *args, **kwargs):
            loop = _FOLLOWED.get(self)
            if loop is not None and loop.step_was_skipped(self.optimizer):
                return None
            return cls.step(self, *args, **kwargs)

        def __reduce_ex__(self, protocol):
            # A copy or a pickle (torch.save of the scheduler) is the plain scheduler.
            return cls.__new__, (cls,), self.__getstate__()

        _FOLLOWING[cls] = type(cls.__name__, (cls,), {
            "step": step, "__reduce_ex__": __reduce_ex__, "_core_ops_follows_skips": True,
            "__module__": cls.__module__, "__qualname__": cls.__qualname__})
    return _FOLLOWING[cls]
