"""``amp.initialize``: Apex's entry point, on torch.autocast and core_ops' multi-tensor
ops instead of monkeypatching and amp_C."""

from __future__ import annotations

import sys
import weakref

import torch

from .. import settings
from ..optimizers.larc import LARC
from ..torch_patches import ddp_init_broadcast
from . import _state, fsdp, opt_levels
from .amp_optimizer import AmpOptimizer, check_keeps_remainders
from .masters import MasterWeights
from .preparation import (check_half_supported, check_models, make_masters, make_state, prepare_model, publish,
                          remainder_seeds, uncompiled)


def _as_list(value, kind, name, allow_empty=False):
    # As Apex: one object or a list; a tuple raised there too (the result could not
    # be returned in the shape given).
    if isinstance(value, kind):
        return [value], True
    if isinstance(value, list) and (value or allow_empty) and all(isinstance(v, kind) for v in value):
        return list(value), False
    what = kind.__name__ if isinstance(kind, type) else kind[0].__name__
    raise TypeError(f"{name} must be a {what} or a {'' if allow_empty else 'non-empty '}list of "
                    f"them, got {type(value).__name__}")


def _check_optimizers(optimizers, models):
    owned = {id(p) for m in models for p in m.parameters()}
    for i, opt in enumerate(optimizers):
        if getattr(opt, "_core_ops_amp", None) is not None:
            raise RuntimeError(f"optimizers[{i}] was already passed to amp.initialize; create a "
                               "fresh optimizer for the fresh model")
        # Params beside the models' (a criterion's, learned loss weights) are fine: they
        # stay float32 and are unscaled with the rest, as in Apex. An optimizer of other
        # models (built before a copy) or one that missed a replaced submodule is not.
        params = [p for group in opt.param_groups for p in group["params"]]
        foreign = [p for p in params if id(p) not in owned]
        if params and len(foreign) == len(params):
            sharded = any(map(fsdp.is_fully_sharded, models))
            raise ValueError(f"optimizers[{i}] holds none of the parameters of the models passed to "
                             f"initialize (its first has shape {tuple(params[0].shape)}); build the "
                             "optimizer from those models' parameters" +
                             (" (fully_shard replaces a model's parameters with sharded ones: build the "
                              "optimizer after sharding)" if sharded else ""))
        if foreign:
            held = {id(p) for o in optimizers for g in o.param_groups for p in g["params"]}
            left = [n for m in models for n, p in m.named_parameters()
                    if p.requires_grad and id(p) not in held]
            if left:
                raise ValueError(
                    f"optimizers[{i}] holds {len(foreign)} parameter(s) of no model passed to "
                    f"initialize while the models' {left[:3]} are in no optimizer: was a "
                    "submodule replaced after the optimizer was built? Build the optimizer from "
                    "the models' current parameters (extra parameters, such as a criterion's, "
                    "are fine once every model parameter is in an optimizer)")


def _say(line):
    """One line in one write, tagged with the rank in a distributed run: print() writes
    the text and the newline apart, so two ranks' banners could share a line."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        line = f"[rank {dist.get_rank()}] {line}"
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def initialize(models, optimizers=None, enabled=True, opt_level=None, cast_model_type=None,
               patch_torch_functions=None, keep_batchnorm_fp32=None, master_weights=None,
               loss_scale=None, cast_model_outputs=None, num_losses=1, verbosity=1,
               min_loss_scale=None, max_loss_scale=None, half_dtype=None, skip_nonfinite=None,
               max_consecutive_skips=None, skip_report_seconds=None):
    """Prepares ``models`` and ``optimizers`` for mixed precision at ``opt_level``
    (Apex's table, see ``opt_levels``), returning them in the shape given (a model or
    a list, and the optimizers likewise; only the models when ``optimizers`` is None).

    ``half_dtype`` (new): torch.float16 as Apex, or torch.bfloat16. Explicit arguments
    override the level's defaults; combinations Apex rejected raise ``ValueError``.
    O1 runs each model's forward under ``torch.autocast(half_dtype)`` (no patching of
    torch functions) and returns float32 outputs unless ``cast_model_outputs`` says
    otherwise, so the loss is computed in float32 as under Apex's patched functions.
    ``skip_nonfinite=True`` (new): a step whose grads hold an inf or nan is skipped at
    every level, O0 and O3 included (Note [Skipping non-finite steps]); O1 and O2 skip
    through dynamic loss scaling anyway. ``max_consecutive_skips=N`` (new): N steps in a
    row skipped for inf / nan grads stop the run with ``NonFiniteTraining``, naming the
    params whose grads are non-finite (``amp.grad_report()`` lists them on demand).
    ``skip_report_seconds=S`` (new): rank 0 prints a line when steps were skipped (how
    many, the scale, the culprit), at most one each S seconds. Each setting left None
    takes its ``CORE_OPS_*`` variable, else its default (Note [One declaration per
    setting]: ``opt_level`` O1 and ``half_dtype`` fp16 as Apex). ``enabled=False`` returns the arguments untouched and checks nothing (as Apex, so
    ``enabled=args.amp`` works with any other arguments).

    Several calls may coexist (a student at O2, a teacher at O3): each optimizer keeps
    the properties and loss scalers of its own call.
    """
    if not enabled:
        _state.set_current(_state.AmpState(opt_levels.Properties(str(opt_level), enabled=False),
                                           [], [], []))
        return models if optimizers is None else (models, optimizers)
    routed = settings.resolve("amp", dict(
        opt_level=opt_level, half_dtype=half_dtype, keep_batchnorm_fp32=keep_batchnorm_fp32,
        master_weights=master_weights, loss_scale=loss_scale, min_loss_scale=min_loss_scale,
        max_loss_scale=max_loss_scale, skip_nonfinite=skip_nonfinite, max_consecutive_skips=max_consecutive_skips,
        skip_report_seconds=skip_report_seconds))
    props = opt_levels.from_settings(routed, enabled, cast_model_type=cast_model_type,
                                     patch_torch_functions=patch_torch_functions,
                                     cast_model_outputs=cast_model_outputs)
    given, single_model = _as_list(models, torch.nn.Module, "models")
    model_list = [uncompiled(m) for m in given]  # prepared in place; the caller keeps its wrappers
    if optimizers is None:
        opt_list, single_opt = [], True
    else:
        opt_list, single_opt = _as_list(optimizers, (torch.optim.Optimizer, LARC), "optimizers",
                                        allow_empty=True)
    if int(num_losses) < 1:
        raise ValueError(f"num_losses must be >= 1, got {num_losses}")

    device_type = check_models(model_list)
    _check_optimizers(opt_list, model_list)
    if props.remainders:  # before anything is cast
        for i, opt in enumerate(opt_list):
            check_keeps_remainders(opt, f"optimizers[{i}]: ", routed)
    check_half_supported(device_type, props)

    registry = make_masters(model_list, props) if props.fp32_masters else MasterWeights()
    seeds = remainder_seeds(model_list, props) if props.remainders else {}
    if len(registry):
        ddp_init_broadcast.install()  # masters follow torch DDP's broadcast (Note [Masters follow DDP's broadcast])
    state = make_state(props, int(num_losses), routed)
    for i, model in enumerate(model_list):
        prepare_model(model, props, registry, state.handle, where=f"models[{i}]: ")
    # Weak references: the state must not keep a finished run's models and optimizers
    # alive (a sweep initializes fresh ones again and again).
    state.models[:] = [weakref.ref(m) for m in model_list]
    state.optimizers[:] = [weakref.ref(o) for o in opt_list]
    for opt in opt_list:
        opt._core_ops_amp = AmpOptimizer(opt, registry if props.fp32_masters else None, state)
        if props.remainders:
            opt._core_ops_amp.keep_remainders(seeds)
    publish(state)
    if verbosity:
        _say(f"core_ops.amp: {props.opt_level} with {props.half_dtype}: "
             f"cast_model_type={props.cast_model_type}, autocast={props.patch_torch_functions}, "
             f"keep_batchnorm_fp32={props.keep_batchnorm_fp32}, "
             f"master_weights={props.master_weights}, loss_scale={props.loss_scale}")
    ms = given[0] if single_model else given
    if optimizers is None:
        return ms
    return ms, (opt_list[0] if single_opt else opt_list)
