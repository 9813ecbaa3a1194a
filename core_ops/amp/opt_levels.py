"""Apex's opt levels as data: each level's defaults, the rules for overriding them,
and the checks that reject combinations Apex rejected."""

from __future__ import annotations

import dataclasses

import torch

from .. import settings


@dataclasses.dataclass
class Properties:
    """What ``initialize`` does; ``cast_model_type`` and ``cast_model_outputs`` are
    dtypes or None (None: the model is not cast), ``loss_scale`` a float or
    ``"dynamic"``."""

    opt_level: str
    enabled: bool = True
    cast_model_type: torch.dtype | None = None
    patch_torch_functions: bool = False
    keep_batchnorm_fp32: bool | None = None
    master_weights: bool | str | None = False  # True, False, None or "remainder"
    loss_scale: float | str = 1.0
    cast_model_outputs: torch.dtype | None = None
    half_dtype: torch.dtype = torch.float16
    # Skip a step whose grads hold an inf / nan at any level, O0 and O3 (a static scale
    # of 1, where Apex checks nothing) included (Note [Skipping non-finite steps]).
    skip_nonfinite: bool = False
    # Stop (NonFiniteTraining) after this many skipped steps in a row; 0: never
    # (Note [Watching skips without a host sync]).
    max_consecutive_skips: int = 0
    # The dynamic scale's floor and ceiling, and how often rank 0 says that steps were
    # skipped (seconds; 0: never): settings of the scaler and the SkipWatch it feeds.
    min_loss_scale: float | None = None
    max_loss_scale: float = settings.MAX_LOSS_SCALE
    skip_report_seconds: float = 0.0

    @property
    def dynamic(self):
        return self.loss_scale == "dynamic"

    @property
    def fp32_masters(self):
        """Apex's O2 masters: float32 copies of the half params, stepped by the optimizer."""
        return bool(self.master_weights) and self.master_weights != "remainder"

    @property
    def remainders(self):
        """master_weights="remainder": the bfloat16 params are the masters' upper halves
        and core_ops' FusedAdam keeps their lower halves (Note [Master remainders])."""
        return self.master_weights == "remainder"


def _levels(half):
    # Apex's table; "half" is the half dtype chosen by the caller (fp16 as in Apex, or bf16).
    return {
        "O0": dict(cast_model_type=torch.float32, patch_torch_functions=False,
                   keep_batchnorm_fp32=None, master_weights=False, loss_scale=1.0),
        "O1": dict(cast_model_type=None, patch_torch_functions=True,
                   keep_batchnorm_fp32=None, master_weights=None, loss_scale="dynamic"),
        "O2": dict(cast_model_type=half, patch_torch_functions=False,
                   keep_batchnorm_fp32=True, master_weights=True, loss_scale="dynamic"),
        "O3": dict(cast_model_type=half, patch_torch_functions=False,
                   keep_batchnorm_fp32=False, master_weights=False, loss_scale=1.0),
    }


OPT_LEVELS = tuple(_levels(torch.float16))


# Apex's own options of initialize, beside the settings (core_ops.settings): no variable sets them.
APEX_ONLY = ("cast_model_type", "patch_torch_functions", "cast_model_outputs")


def from_settings(routed, enabled=True, **apex_only):
    """The Properties of ``routed`` (a ``settings.Resolved`` of a route that reads the
    amp settings) and Apex's own ``apex_only`` options."""
    amp = {k: v for k, v in routed.values.items() if k in settings.ROUTES["amp"]}
    return resolve(amp.pop("opt_level"), amp.pop("half_dtype"), enabled, routed=routed, **amp, **apex_only)


def half_dtype_of(value, where="half_dtype"):
    return settings.half_dtype(value, where)


def resolve(opt_level, half_dtype=torch.float16, enabled=True, routed=None, **overrides):
    """The Properties for ``opt_level`` with the non-None ``overrides`` applied, after
    Apex's consistency checks (which raise ``ValueError`` here, never just warn).
    ``routed`` (a ``settings.Resolved``) says where each value came from, so that an
    error names the variable or the argument the user wrote, and the fix in that route."""
    routed = routed or settings.Resolved("amp", {}, {})

    def said(name, value=None):  # how the user spelt it, e.g. CORE_OPS_MASTER_WEIGHTS='remainder'
        return routed.where(name) if name in routed.sources else f"{name}={value!r}"

    if opt_level not in ("O0", "O1", "O2", "O3"):
        source = routed.sources.get("opt_level", "argument")
        settings.opt_level(opt_level, source if source.startswith("CORE_OPS_") else "opt_level")
    half = settings.half_dtype(half_dtype, "half_dtype")
    levels = _levels(half)
    props = Properties(opt_level=opt_level, enabled=enabled, half_dtype=half, **levels[opt_level])
    overrides = {k: v for k, v in overrides.items() if v is not None}
    # Apex's cast_model_type=False: leave the model's dtypes as they are, at any level
    # (its multi-model tests pass it; None there means "the level's default").
    no_cast = overrides.get("cast_model_type") is False
    if no_cast:
        del overrides["cast_model_type"]
    for name in overrides.keys() & settings.BY_NAME.keys():  # each setting's own parser
        overrides[name] = settings.BY_NAME[name].parse(overrides[name], name)
    for key in ("cast_model_type", "cast_model_outputs"):
        if key in overrides and not (isinstance(overrides[key], torch.dtype)
                                     and overrides[key].is_floating_point):
            raise ValueError(f"{key} must be a floating torch.dtype"
                             f"{' or False' if key == 'cast_model_type' else ''}, got {overrides[key]!r}")

    if opt_level == "O1":
        if overrides.get("cast_model_type") not in (None, torch.float32):
            raise ValueError("O1 runs the model's forward under torch.autocast, so the weights stay "
                             f"float32; cast_model_type={overrides['cast_model_type']} needs "
                             "opt_level='O2' or 'O3'")
        if "keep_batchnorm_fp32" in overrides:
            raise ValueError(f"with O1 autocast decides the precision of batchnorm; leave keep_batchnorm_fp32 "
                             f"unset ({said('keep_batchnorm_fp32', overrides['keep_batchnorm_fp32'])})")
        if "master_weights" in overrides:
            raise ValueError(f"with O1 the model's weights are float32 already, so master_weights makes no "
                             f"sense ({said('master_weights', overrides['master_weights'])}); leave it "
                             f"unset or use O2")
    elif overrides.get("patch_torch_functions"):
        raise ValueError("patch_torch_functions=True (autocast) belongs to opt_level='O1'")

    for key, value in overrides.items():
        setattr(props, key, value)
    if no_cast:
        # master_weights then applies to the params that arrive half (Apex made masters
        # for its fp16 params only), with allow_incoming_model_not_fp32.
        props.cast_model_type = None
    elif props.master_weights and props.cast_model_type in (None, torch.float32):
        raise ValueError(f"{said('master_weights', props.master_weights)} needs a model cast to a half dtype "
                         "(O2, or cast_model_type=torch.float16 / torch.bfloat16)")
    if props.remainders and props.cast_model_type not in (None, torch.bfloat16):
        raise ValueError(f"{said('master_weights', 'remainder')} keeps the lower 16 bits of float32 masters "
                         f"beside bfloat16 params; a {props.cast_model_type} model has no such upper halves: "
                         f"{routed.how_to_set('half_dtype', 'torch.bfloat16', 'bf16')}, or "
                         f"{routed.how_to_set('master_weights', 'True', '1')} for float16")
    if props.cast_model_type in (torch.float16, torch.bfloat16):
        props.half_dtype = props.cast_model_type
    return props
