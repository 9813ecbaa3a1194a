"""``ApexPrecision``, written once for Lightning's Trainer and Fabric and for both of its
package trees (``lightning.*`` and the standalone ``pytorch_lightning`` /
``lightning_fabric``, whose classes are distinct): ``precision_classes(tree)`` makes the
pair for one tree. Every hook hands off to ``core_ops.amp.AmpLoop``; nothing numeric
lives here.

The order of a training step (Trainer): ``convert_module`` casts the model and makes
the fp32 masters before the strategy moves and wraps it; ``connect`` attaches the
optimizers (their param groups take the masters) and holds the step-wise LR schedulers
still after skipped steps; ``pre_backward`` scales the loss; after each backward that
DDP synced the grads go into the masters at once (fp32 accumulation), inside
``no_sync`` (``accumulate_grad_batches``) they stay scaled until the synced one;
``optimizer_step`` unscales, lets Lightning clip (the true norm, one pass) and steps,
skipped on overflow, then updates the loss scale and logs it (``loss_scale``,
``skipped_steps``) every ``log_every_n_steps`` steps and at an epoch's end.
"""

from __future__ import annotations

import contextlib

import torch

from core_ops import settings
from core_ops._forwarding import forwarded
from core_ops.amp import AmpLoop
from core_ops.amp.opt_levels import APEX_ONLY
from core_ops.optimizers.twins import fused_twin, point_scheduler_at, wants_twin

from .names import is_ours, name_of, parse


class _Apex:
    """What both classes share: the settings and the AmpLoop."""

    def __init__(self, opt_level=None, half_dtype=None, **options):
        """``opt_level``: O0-O3, or a name such as ``"apex-O2-bf16"``; ``half_dtype``:
        torch.float16 (Apex's, the default) or torch.bfloat16; ``options``: the settings
        of Lightning's route (``core_ops.settings``: ``loss_scale``,
        ``keep_batchnorm_fp32``, ``master_weights``, ``min_loss_scale``, ...,
        ``skip_nonfinite`` (default True), ``max_consecutive_skips`` (default 50; 0
        never stops), ``skip_report_seconds``, ``fused_optimizer``). Each left None
        takes its ``CORE_OPS_*`` variable, else the plugins' default."""
        spelled = {}
        if is_ours(opt_level):
            name = opt_level
            opt_level, named_dtype = parse(name)
            spelled["opt_level"] = f"precision={name!r}"
            # A name fixes the half dtype (apex-O2 is fp16's), unless half_dtype says otherwise.
            if half_dtype is None and opt_level != "O0":
                half_dtype, spelled["half_dtype"] = named_dtype, f"precision={name!r}"
        apex_only = {k: options[k] for k in APEX_ONLY if k in options}  # Apex's own: no variable sets them
        try:
            self.settings = settings.resolve(
                "lightning", dict({k: v for k, v in options.items() if k not in apex_only}, opt_level=opt_level,
                                  half_dtype=half_dtype), spelled=spelled, also=APEX_ONLY)
        except TypeError as e:
            raise TypeError(f"ApexPrecision got {e}") from None
        self.loop = AmpLoop(routed=self.settings, **apex_only)
        # What rebuilds it in another tree (_compat): the arguments as given.
        self.options = dict(options, opt_level=opt_level, half_dtype=half_dtype)
        self.precision = name_of(self.loop.opt_level, self.loop.half_dtype)

    def __repr__(self):
        """Every setting in effect that is not the route's default, wherever it came from
        (an argument or a ``CORE_OPS_*`` variable, which is said): what this plugin
        will do, not only what its caller passed."""
        shown = [f"{k}={v!r}" for k, v in self.options.items() if k in APEX_ONLY]
        for name, value in self.settings.values.items():
            source = self.settings.sources[name]
            if name in ("opt_level", "half_dtype") or source == "default":
                continue
            said = str(value).removeprefix("torch.") if name == "half_dtype" else repr(value)
            shown.append(f"{name}={said}" + (f" ({source})" if source.startswith("CORE_OPS_") else ""))
        extra = "".join(f", {s}" for s in shown)
        return f"{type(self).__name__}({self.loop.opt_level!r}, half_dtype={self.loop.half_dtype}{extra})"

    # ---- what users read ------------------------------------------------------------

    loss_scale = forwarded("loop", "loss_scale", "The current loss scale, a float (a host sync).")
    skipped_steps = forwarded("loop", "skipped_steps", "Steps skipped for inf / nan grads so far (a host sync).")

    def step_was_skipped(self, optimizer):
        return self.loop.step_was_skipped(getattr(optimizer, "optimizer", optimizer))

    # ---- the model and its inputs ----------------------------------------------------

    converts_after_sharding = False  # set by Fabric's apex-fsdp, which prepares the shards

    def convert_module(self, module):
        return module if self.converts_after_sharding else self.loop.prepare_model(module)

    # convert_input stays Lightning's (nothing): at O2 / O3 each half layer casts what
    # reaches it, so a batch's float targets keep their precision.

    @contextlib.contextmanager
    def forward_context(self):
        with self.loop.autocast():
            yield

    def state_dict(self):
        return self.loop.state_dict()

    def load_state_dict(self, state_dict):
        self.loop.load_state_dict(state_dict)


def _logs_this_step(trainer):
    """Whether Lightning sends this training step's on_step metrics to its loggers."""
    connector = getattr(trainer, "_logger_connector", None)  # private: any failure logs every step
    try:
        return bool(connector.should_update_logs or trainer.fast_dev_run or trainer.is_last_batch)
    except Exception:
        return True


def _syncs(wrapper):
    """Whether a backward through ``wrapper`` (a torch or core_ops DDP, or a bare
    module) reduces the grads: False inside ``no_sync()``."""
    return getattr(wrapper, "require_backward_grad_sync", True)


class _TrainerApex(_Apex):
    """The Trainer's hooks (lightning.pytorch's Precision)."""

    def connect(self, model, optimizers, lr_schedulers):
        twins = {}
        for i, optimizer in enumerate(optimizers):
            wanted = wants_twin(optimizer, self.settings["fused_optimizer"], self.loop.properties)
            twin = fused_twin(optimizer) if wanted else None
            if twin is not None:
                optimizers[i] = twins[id(optimizer)] = twin
        for config in lr_schedulers:
            if id(config.scheduler.optimizer) in twins:
                point_scheduler_at(config.scheduler, twins[id(config.scheduler.optimizer)])
        for optimizer in optimizers:
            self.loop.attach(optimizer)
        for config in lr_schedulers:
            if config.interval == "step":  # an epoch's schedule is not a step's to hold
                self.loop.follow_skips(config.scheduler)
        return model, optimizers, lr_schedulers

    def pre_backward(self, tensor, module):
        return super().pre_backward(self.loop.scale(tensor), module)

    def backward(self, tensor, model, optimizer, *args, **kwargs):
        model.backward(tensor, *args, **kwargs)
        if optimizer is not None and _syncs(model.trainer.strategy.model):
            self.loop.unscale_(optimizer)

    def optimizer_step(self, optimizer, model, closure, **kwargs):
        if isinstance(optimizer, torch.optim.LBFGS):
            raise RuntimeError("apex-O* precision and the LBFGS optimizer are not compatible: LBFGS "
                               "re-runs its closure inside step(), after the grads were unscaled")
        closure_result = closure()
        stepped = closure_result is not None or not model.automatic_optimization  # None: no backward
        if stepped:
            self.loop.unscale_(optimizer)
        self._after_closure(model, optimizer)  # on_before_optimizer_step, then clipping
        if not stepped:
            return closure_result
        out = self.loop.step(optimizer, **kwargs)
        self.loop.update()
        # O0 and O3 without loss scaling have nothing to report. Lightning's log() costs
        # about 1,900 Python calls; two a step doubled the host time of a small model's
        # step, so the scale is logged on the steps whose metrics Lightning sends to the
        # loggers (log_every_n_steps) and on an epoch's last batch.
        if self.loop.scaling and _logs_this_step(model.trainer):
            scale, skipped = self.loop.counters()
            model.log("loss_scale", scale, on_step=True, on_epoch=False, rank_zero_only=True)
            model.log("skipped_steps", skipped, on_step=True, on_epoch=False, rank_zero_only=True)
        return out

    def clip_gradients(self, optimizer, clip_val=0.0, gradient_clip_algorithm="norm"):
        if clip_val <= 0:
            return
        if gradient_clip_algorithm == "value":
            self.loop.unscale_(optimizer)
            torch.nn.utils.clip_grad_value_(list(self.main_params(optimizer)), clip_val)
        else:
            self.loop.clip_grad_norm_(optimizer, clip_val)


class _FabricApex(_Apex):
    """Fabric's hooks (lightning.fabric's Precision). Fabric shows the plugin each
    optimizer first at its step (or clip), so the backward passes before it leave the
    grads scaled and that first step unscales them (``AmpLoop`` attaches it then)."""

    def backward(self, tensor, model, *args, **kwargs):
        self.loop.scale(tensor).backward(*args, **kwargs)

    def unscale_gradients(self, optimizer):
        self.loop.unscale_(optimizer)

    def main_params(self, optimizer):
        self.loop.attach(optimizer)  # the masters, once the param groups hold them
        return super().main_params(optimizer)

    def optimizer_step(self, optimizer, **kwargs):
        if kwargs.get("closure") is not None:
            raise RuntimeError("apex-O* precision takes no closure in optimizer.step(): the closure "
                               "would run backward after the grads were unscaled")
        out = self.loop.step(optimizer, **kwargs)
        self.loop.update()
        self._log_to_fabric()
        return out

    fabric = None  # a weak reference to the Fabric, set by its __init__ (_compat._introducing_fabric)
    log_every_n_steps = 50  # as the Trainer's default

    def _log_to_fabric(self):
        """The loss scale and skipped steps through the Fabric's loggers, if it has any,
        every ``log_every_n_steps`` steps (as the Trainer logs them): device tensors,
        read by the loggers, no host sync here."""
        self.steps = getattr(self, "steps", 0) + 1
        fabric = self.fabric() if self.fabric is not None else None
        if fabric is None or not fabric.loggers or not self.loop.scaling or self.steps % self.log_every_n_steps:
            return
        scale, skipped = self.loop.counters()
        fabric.log_dict({"loss_scale": scale, "skipped_steps": skipped}, step=self.steps)

    def __getstate__(self):  # ddp_spawn pickles the plugin: the Fabric stays behind
        return {k: v for k, v in self.__dict__.items() if k != "fabric"}


def precision_classes(trainer_pkg, fabric_pkg, module_name):
    """(Trainer ApexPrecision, Fabric ApexPrecision) of one Lightning tree, both named
    ``ApexPrecision`` in ``module_name`` (_trees.py moves Fabric's to its own module,
    where pickling finds it: ``ddp_spawn`` sends the plugin to its processes). Written
    here, once, over the tree's own Precision classes."""

    class ApexPrecision(_TrainerApex, trainer_pkg.plugins.precision.Precision):
        """Apex's opt levels for Lightning: ``Trainer(plugins=[ApexPrecision('O2',
        half_dtype=torch.bfloat16, loss_scale='dynamic')])``, or ``precision='apex-O2'``."""

    class ApexFabricPrecision(_FabricApex, fabric_pkg.plugins.precision.Precision):
        """Apex's opt levels for Fabric: ``Fabric(plugins=[ApexPrecision('O2',
        half_dtype=torch.bfloat16, loss_scale='dynamic')])``, or ``precision='apex-O2'``."""

    for cls in (ApexPrecision, ApexFabricPrecision):  # each module names its class ApexPrecision
        cls.__name__ = cls.__qualname__ = "ApexPrecision"
        cls.__module__ = module_name
    return ApexPrecision, ApexFabricPrecision
