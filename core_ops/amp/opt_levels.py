"""Apex's opt levels as data: each level's defaults, the rules for overriding them,
and the checks that reject combinations Apex rejected."""

from __future__ import annotations

import dataclasses

import torch

HALF_DTYPES = {"float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
               "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


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
    # Stop (NonFiniteTraining) after this many skipped steps in a row; None: never
    # (Note [Watching skips without a host sync]).
    max_consecutive_skips: int | None = None

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


def half_dtype_of(value):
    if isinstance(value, torch.dtype) and value in (torch.float16, torch.bfloat16):
        return value
    if isinstance(value, str) and value.lower() in HALF_DTYPES:
        return HALF_DTYPES[value.lower()]
    raise ValueError(f"half_dtype must be torch.float16 or torch.bfloat16 (or 'fp16' / 'bf16'), "
                     f"got {value!r}")


def _bool_or_none(name, value):
    # Apex accepted the strings "True" / "False" (from argparse) for keep_batchnorm_fp32.
    if isinstance(value, str):
        if value not in ("True", "False"):
            raise ValueError(f"{name} must be True, False or None (or the strings 'True' / "
                             f"'False'), got {value!r}")
        return value == "True"
    return value


def _loss_scale(value):
    if value == "dynamic":
        return value
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"loss_scale must be a number > 0 or 'dynamic', got {value!r}") from None
    if not value > 0:
        raise ValueError(f"loss_scale must be > 0 or 'dynamic', got {value}")
    return value


def resolve(opt_level, half_dtype=torch.float16, enabled=True, **overrides):
    """The Properties for ``opt_level`` with the non-None ``overrides`` applied, after
    Apex's consistency checks (which raise ``ValueError`` here, never just warn)."""
    half = half_dtype_of(half_dtype)
    levels = _levels(half)
    if opt_level not in levels:
        hint = " (the letter O, not the digit 0)" if str(opt_level).startswith("0") else ""
        raise ValueError(f"unknown opt_level {opt_level!r}{hint}; expected one of {', '.join(levels)}")
    props = Properties(opt_level=opt_level, enabled=enabled, half_dtype=half, **levels[opt_level])
    overrides = {k: v for k, v in overrides.items() if v is not None}
    # Apex's cast_model_type=False: leave the model's dtypes as they are, at any level
    # (its multi-model tests pass it; None there means "the level's default").
    no_cast = overrides.get("cast_model_type") is False
    if no_cast:
        del overrides["cast_model_type"]
    if "keep_batchnorm_fp32" in overrides:
        overrides["keep_batchnorm_fp32"] = _bool_or_none("keep_batchnorm_fp32",
                                                         overrides["keep_batchnorm_fp32"])
    if "loss_scale" in overrides:
        overrides["loss_scale"] = _loss_scale(overrides["loss_scale"])
    if "skip_nonfinite" in overrides and not isinstance(overrides["skip_nonfinite"], bool):
        raise ValueError(f"skip_nonfinite must be True or False, got {overrides['skip_nonfinite']!r}")
    limit = overrides.get("max_consecutive_skips")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"max_consecutive_skips must be an int >= 1 or None, got {limit!r}")
    if "master_weights" in overrides and overrides["master_weights"] != "remainder":
        if overrides["master_weights"] not in (True, False, "True", "False"):
            raise ValueError(f"master_weights must be True, False, None or \"remainder\" (bfloat16 params "
                             f"with int16 remainders in FusedAdam), got {overrides['master_weights']!r}")
        overrides["master_weights"] = _bool_or_none("master_weights", overrides["master_weights"])
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
            raise ValueError("with O1 autocast decides the precision of batchnorm; leave "
                             "keep_batchnorm_fp32 as None")
        if "master_weights" in overrides:
            raise ValueError("with O1 the model's weights are float32 already, so master_weights "
                             "makes no sense; leave it as None or use O2")
    elif overrides.get("patch_torch_functions"):
        raise ValueError("patch_torch_functions=True (autocast) belongs to opt_level='O1'")

    for key, value in overrides.items():
        setattr(props, key, value)
    if no_cast:
        # master_weights then applies to the params that arrive half (Apex made masters
        # for its fp16 params only), with allow_incoming_model_not_fp32.
        props.cast_model_type = None
    elif props.master_weights and props.cast_model_type in (None, torch.float32):
        raise ValueError(f"master_weights={props.master_weights!r} needs a model cast to a half dtype (O2, or "
                         "cast_model_type=torch.float16 / torch.bfloat16)")
    if props.remainders and props.cast_model_type not in (None, torch.bfloat16):
        raise ValueError(f"master_weights=\"remainder\" keeps the lower 16 bits of float32 masters beside "
                         f"bfloat16 params; a {props.cast_model_type} model has no such upper halves: pass "
                         "half_dtype=torch.bfloat16, or master_weights=True for float16")
    if props.cast_model_type in (torch.float16, torch.bfloat16):
        props.half_dtype = props.cast_model_type
    return props
