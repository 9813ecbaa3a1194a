"""What an Accelerator with an ``ApexPlugin`` does differently. ``_compat.py`` makes the
Accelerator an instance of ``with_apex(type(accelerator))``: its class with the
methods below in front, each a few lines that call into the plugin's
``core_ops.amp.AmpLoop`` and then, mostly, Accelerate's own method.

- ``prepare`` prepares the models of a call first (the optimizers need their masters);
  ``prepare_model`` converts BatchNorm to core_ops' SyncBatchNorm when asked, casts the
  model and makes its fp32 masters (they follow the model to its device), lets
  Accelerate place it, and in multi-process runs wraps it in core_ops'
  DistributedDataParallel instead of torch's;
- ``prepare_optimizer`` swaps in the fused twin when asked, attaches the optimizer (its
  groups take the masters) and wraps it in an ``ApexAcceleratedOptimizer``, whose
  step is skipped on overflow and reports it (``step_was_skipped``, which Accelerate's
  scheduler wrapper and ``optimizer_step_was_skipped`` read);
- ``backward`` scales the loss; a backward that DDP synced goes into the masters at
  once, one inside ``accumulate()`` / ``no_sync()`` stays scaled until the synced one;
- ``unscale_gradients``, ``clip_grad_norm_`` and ``clip_grad_value_`` work on the
  unscaled master grads (Accelerate's own unscale runs only for its fp16 path) and
  ``clip_grad_norm_`` returns the true norm, in one pass;
- ``unwrap_model`` unwraps core_ops' DDP too (``get_state_dict`` and ``save_model``
  build on it: fp32 weights, the masters');
- ``autocast`` is O1's autocast.
"""

from __future__ import annotations

import contextlib
import warnings

import torch
from accelerate.optimizer import AcceleratedOptimizer

from core_ops.optimizers import fused_twin
from core_ops.optimizers.twins import point_scheduler_at, wants_twin
from core_ops.parallel import DistributedDataParallel, convert_syncbn_model


class ApexAcceleratedOptimizer(AcceleratedOptimizer):
    """Accelerate's optimizer wrapper, stepped through the AmpLoop."""

    def __init__(self, optimizer, device_placement, loop):
        self.loop = loop
        super().__init__(optimizer, device_placement=device_placement, scaler=None)

    def step(self, closure=None):
        if closure is not None:
            raise RuntimeError("ApexPlugin takes no closure in optimizer.step(): the closure would run "
                               "backward after the grads were unscaled")
        if self.gradient_state.sync_gradients:  # Accelerate's: no step while accumulating
            self.loop.step(self.optimizer)
            self.loop.update()

    @property
    def step_was_skipped(self):
        """Whether the last step was skipped for inf / nan grads (a host sync)."""
        return self.loop.step_was_skipped(self.optimizer)


def _inner(optimizer):
    while isinstance(optimizer, AcceleratedOptimizer):
        optimizer = optimizer.optimizer
    return optimizer


class _ApexMethods:
    """The methods an Accelerator with an ApexPlugin runs in front of its own."""

    @property
    def core_ops_apex(self):
        """The ApexPlugin (its ``loop``, ``loss_scale_value``, ``skipped_steps``)."""
        return self._core_ops_apex

    def prepare(self, *args, device_placement=None):
        if getattr(self, "is_fsdp2", False):
            return self._prepare_sharded(*args, device_placement=device_placement)
        order = sorted(range(len(args)), key=lambda i: not isinstance(args[i], torch.nn.Module))
        placement = None if device_placement is None else [device_placement[i] for i in order]
        done = super().prepare(*[args[i] for i in order], device_placement=placement)
        done = done if len(args) > 1 else (done,)
        result = [None] * len(args)
        for position, obj in zip(order, done):
            result[position] = obj
        return tuple(result) if len(args) > 1 else result[0]

    def _prepare_sharded(self, *args, device_placement=None):
        """FSDP2 (``FullyShardedDataParallelPlugin(fsdp_version=2)``): Accelerate shards the
        model and moves the optimizers' param groups onto the shards; the opt level then
        takes the sharded model (its float32 shards are O2's masters, FSDP2's mixed
        precision computes in half: Note [Opt levels on FSDP2]) and the optimizers are
        attached to those shards."""
        done = super().prepare(*args, device_placement=device_placement)
        items = done if len(args) > 1 else (done,)
        loop = self._core_ops_apex.loop
        for obj in items:
            if isinstance(obj, torch.nn.Module):
                loop.prepare_model(obj)
        for obj in items:
            if isinstance(obj, ApexAcceleratedOptimizer):
                loop.attach(obj.optimizer)
        return done

    def prepare_model(self, model, device_placement=None, evaluation_mode=False):
        if getattr(model, "_is_accelerate_prepared", False):
            return super().prepare_model(model, device_placement, evaluation_mode)
        apex = self._core_ops_apex
        if apex.sync_bn and not evaluation_mode:
            model = convert_syncbn_model(model)
        apex.loop.prepare_model(model)
        wrap = self.use_distributed and not evaluation_mode and any(p.requires_grad for p in model.parameters())
        bare = super().prepare_model(model, device_placement, evaluation_mode=evaluation_mode or wrap)
        if not wrap:
            return bare
        ddp = DistributedDataParallel(bare, **apex.ddp_options())
        self._models = [ddp if m is bare else m for m in self._models]
        ddp._is_accelerate_prepared = True
        return ddp

    def prepare_optimizer(self, optimizer, device_placement=None):
        if getattr(optimizer, "_is_accelerate_prepared", False):  # the wrapper again (find_executable_batch_size)
            return super().prepare_optimizer(optimizer, device_placement)
        apex = self._core_ops_apex
        inner = _inner(optimizer)
        if getattr(inner, "_core_ops_amp", None) is not None and any(_inner(o) is inner for o in self._optimizers):
            raise ValueError("this optimizer was prepared already: prepare each optimizer once (pass the one "
                             "accelerator.prepare returned to later calls, or none)")
        sharded = getattr(self, "is_fsdp2", False)  # attached after Accelerate shards (_prepare_sharded)
        if not sharded and apex.loop.casts_model and apex.loop.properties.fp32_masters and not any(
                apex.loop.registry.get(p) is not None for g in inner.param_groups for p in g["params"]):
            raise ValueError(f"ApexPlugin({apex.opt_level}) needs the model prepared before or together "
                             "with its optimizer: accelerator.prepare(model, optimizer, ...); this optimizer "
                             "holds none of a prepared model's half parameters")
        twin = fused_twin(inner) if wants_twin(inner, apex.fused_optimizer, apex.loop.properties) else None
        if twin is not None:
            self._core_ops_twins[id(inner)] = twin
            inner = twin
        elif apex.fused_optimizer:  # (an unset one asked for by "remainder": attach names the optimizer)
            warnings.warn(f"ApexPlugin(fused_optimizer=True): {type(inner).__name__} has no core_ops twin "
                          "(AdamW, Adam, SGD and Adagrad do); it steps as it is", stacklevel=3)
        if not sharded:
            apex.loop.attach(inner)
        if device_placement is None:
            device_placement = self.device_placement
        wrapped = ApexAcceleratedOptimizer(inner, device_placement, apex.loop)
        wrapped._is_accelerate_prepared = True
        self._optimizers.append(wrapped)
        return wrapped

    def prepare_scheduler(self, scheduler):
        twin = self._core_ops_twins.get(id(getattr(scheduler, "optimizer", None)))
        if twin is not None:
            point_scheduler_at(scheduler, twin)
        return super().prepare_scheduler(scheduler)

    def backward(self, loss, **kwargs):
        apex = self._core_ops_apex
        if apex.loop.casts_model and apex.loop.properties.master_weights and not self._optimizers:
            raise RuntimeError(f"ApexPlugin({apex.opt_level}) steps fp32 master weights through the "
                               "prepared optimizer: prepare the optimizer too, "
                               "accelerator.prepare(model, optimizer, ...)")
        apex.loop.scale(loss / self.gradient_accumulation_steps).backward(**kwargs)
        if all(getattr(m, "require_backward_grad_sync", True) for m in self._models):
            for optimizer in self._optimizers:
                apex.loop.unscale_(_inner(optimizer))

    def unscale_gradients(self, optimizer=None):
        optimizers = self._optimizers if optimizer is None else (
            optimizer if isinstance(optimizer, (list, tuple)) else [optimizer])
        for opt in optimizers:
            self._core_ops_apex.loop.unscale_(_inner(opt))

    def clip_grad_norm_(self, parameters, max_norm, norm_type=2):
        loop = self._core_ops_apex.loop
        if norm_type != 2:
            self.unscale_gradients()
            return torch.nn.utils.clip_grad_norm_(loop.main_params(parameters), max_norm, norm_type=norm_type)
        return loop.clip_grad_norm_(list(parameters), max_norm)

    def clip_grad_value_(self, parameters, clip_value):
        self.unscale_gradients()
        torch.nn.utils.clip_grad_value_(self._core_ops_apex.loop.main_params(parameters), clip_value)

    def unwrap_model(self, model, keep_fp32_wrapper=True, keep_torch_compile=True):
        while isinstance(model, DistributedDataParallel):
            model = model.module
        return super().unwrap_model(model, keep_fp32_wrapper, keep_torch_compile)

    def autocast(self, autocast_handler=None):
        loop = self._core_ops_apex.loop
        if loop.properties.patch_torch_functions:
            return loop.autocast(self.device.type)
        return contextlib.nullcontext()


_WITH_APEX = {}


def with_apex(cls):
    """``cls`` (Accelerator or a user's subclass) with the ApexPlugin methods in front."""
    if issubclass(cls, _ApexMethods):
        return cls
    if cls not in _WITH_APEX:
        _WITH_APEX[cls] = type(cls.__name__, (_ApexMethods, cls), {
            "__module__": cls.__module__, "__qualname__": cls.__qualname__})
    return _WITH_APEX[cls]
