"""``ApexPlugin``: the kwargs handler that switches core_ops on in an Accelerator, its
options and their ``CORE_OPS_*`` environment variables (which ``accelerate launch``
passes to every process). A field left None takes its variable's value, else its
default; bad values, from code or the environment, are errors that name the valid ones."""

from __future__ import annotations

import dataclasses
import os

import torch
from accelerate.utils import KwargsHandler

from core_ops._environment import MAX_CONSECUTIVE_SKIPS, skip_limit
from core_ops._environment import flag as _flag
from core_ops.amp import AmpLoop
from core_ops.amp.opt_levels import OPT_LEVELS, half_dtype_of
from core_ops.parallel import DDPOptions
from core_ops.parallel.options import reduce_dtype_of



def _master_weights(value, name):
    # "remainder": bfloat16 params plus int16 remainders in FusedAdam (core_ops.amp).
    if str(value).lower() == "remainder":
        return "remainder"
    try:
        return _flag(value, name)
    except ValueError as e:
        raise ValueError(f"{e} or remainder") from None


def _number(kind):
    def parse(value, name):
        try:
            return kind(float(value)) if kind is int else kind(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name}={value!r}: expected a number") from None
    return parse


def _opt_level(value, name):
    if value not in OPT_LEVELS:
        hint = " (the letter O, not the digit 0)" if str(value).startswith("0") else ""
        raise ValueError(f"{name}={value!r}: expected one of {', '.join(OPT_LEVELS)}{hint}")
    return value


def _half(value, name):
    try:
        return half_dtype_of(value)
    except ValueError:
        raise ValueError(f"{name}={value!r}: expected fp16 or bf16 (torch.float16 / torch.bfloat16)") from None


def _loss_scale(value, name):
    if value == "dynamic":
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r}: expected 'dynamic' or a number > 0") from None


def _reduce_dtype(value, name):
    # DDP's reduce dtypes by dtype or name (fp32, bf16, fp16, ...), parsed as DDPOptions does.
    return reduce_dtype_of(value, name)


# field -> (environment variable, parser, default)
FIELDS = {
    "opt_level": ("CORE_OPS_OPT_LEVEL", _opt_level, "O2"),
    "half_dtype": ("CORE_OPS_HALF_DTYPE", _half, torch.float16),
    "loss_scale": ("CORE_OPS_LOSS_SCALE", _loss_scale, None),
    "keep_batchnorm_fp32": ("CORE_OPS_KEEP_BATCHNORM_FP32", _flag, None),
    "master_weights": ("CORE_OPS_MASTER_WEIGHTS", _master_weights, None),
    "min_loss_scale": ("CORE_OPS_MIN_LOSS_SCALE", _number(float), None),
    "max_loss_scale": ("CORE_OPS_MAX_LOSS_SCALE", _number(float), 2.0**24),
    "skip_nonfinite": ("CORE_OPS_SKIP_NONFINITE", _flag, True),
    "max_consecutive_skips": ("CORE_OPS_MAX_CONSECUTIVE_SKIPS", skip_limit, MAX_CONSECUTIVE_SKIPS),
    "sync_bn": ("CORE_OPS_SYNC_BN", _flag, False),
    "fused_optimizer": ("CORE_OPS_FUSED_OPTIMIZER", _flag, False),
    # core_ops DistributedDataParallel's, with its defaults (DDPOptions)
    "message_size": ("CORE_OPS_MESSAGE_SIZE", _number(int), DDPOptions.message_size),
    "delay_allreduce": ("CORE_OPS_DELAY_ALLREDUCE", _flag, DDPOptions.delay_allreduce),
    "allreduce_always_fp32": ("CORE_OPS_ALLREDUCE_ALWAYS_FP32", _flag, DDPOptions.allreduce_always_fp32),
    "allreduce_dtype": ("CORE_OPS_ALLREDUCE_DTYPE", _reduce_dtype, DDPOptions.allreduce_dtype),
    "gradient_predivide_factor": ("CORE_OPS_GRADIENT_PREDIVIDE_FACTOR", _number(float),
                                  DDPOptions.gradient_predivide_factor),
}
AMP_OPTIONS = ("loss_scale", "keep_batchnorm_fp32", "master_weights", "min_loss_scale", "max_loss_scale",
               "skip_nonfinite", "max_consecutive_skips")
DDP_OPTIONS = ("message_size", "delay_allreduce", "allreduce_always_fp32", "allreduce_dtype",
               "gradient_predivide_factor")


@dataclasses.dataclass
class ApexPlugin(KwargsHandler):
    """core_ops in an Accelerator: ``Accelerator(kwargs_handlers=[ApexPlugin(opt_level="O2")])``.

    ``opt_level`` O0-O3 and ``half_dtype`` (fp16, Apex's, or bf16) with the loss-scale
    options of ``core_ops.amp.initialize``; ``sync_bn`` converts BatchNorm to core_ops'
    SyncBatchNorm (on CPU too); ``fused_optimizer`` steps a torch.optim AdamW / Adam /
    SGD / Adagrad with its core_ops twin (same hyperparameters and state; LR schedulers
    follow it); ``skip_nonfinite`` (default True) skips a step whose grads hold an inf
    or nan at every level, and ``max_consecutive_skips`` (default 50, 0: never) such
    skips in a row stop the run naming the non-finite grads; and core_ops
    DistributedDataParallel's options for multi-process runs.
    Every field left None comes from its ``CORE_OPS_*`` variable (``FIELDS``)."""

    opt_level: str | None = None
    half_dtype: torch.dtype | str | None = None
    loss_scale: float | str | None = None
    keep_batchnorm_fp32: bool | None = None
    master_weights: bool | str | None = None
    min_loss_scale: float | None = None
    max_loss_scale: float | None = None
    skip_nonfinite: bool | None = None
    max_consecutive_skips: int | None = None
    sync_bn: bool | None = None
    fused_optimizer: bool | None = None
    message_size: int | None = None
    delay_allreduce: bool | None = None
    allreduce_always_fp32: bool | None = None
    allreduce_dtype: torch.dtype | str | None = None
    gradient_predivide_factor: float | None = None

    def __post_init__(self):
        for name, (env, parse, default) in FIELDS.items():
            value = getattr(self, name)
            where = name
            if value is None and os.environ.get(env, "") != "":
                value, where = os.environ[env], env
            setattr(self, name, default if value is None else parse(value, where))
        self._ddp = DDPOptions(**{k: getattr(self, k) for k in DDP_OPTIONS})  # checked here, at construction
        options = {k: getattr(self, k) for k in AMP_OPTIONS if getattr(self, k) is not None}
        self.loop = AmpLoop(self.opt_level, half_dtype=self.half_dtype, **options)

    def ddp_options(self):
        return self._ddp.as_kwargs()

    # ---- what Accelerator.save_state / load_state keep (register_for_checkpointing)

    def state_dict(self):
        return self.loop.state_dict()

    def load_state_dict(self, state_dict):
        self.loop.load_state_dict(state_dict)

    # ---- reading ---------------------------------------------------------------------

    @property
    def loss_scale_value(self):
        """The current loss scale, a float (a host sync)."""
        return self.loop.loss_scale

    @property
    def skipped_steps(self):
        """Optimizer steps skipped for inf / nan grads so far (a host sync)."""
        return self.loop.skipped_steps

    def to_dict(self):  # KwargsHandler's: the options, without the loop
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
