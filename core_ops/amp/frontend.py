"""``amp.initialize``: Apex's entry point, on torch.autocast and core_ops' multi-tensor
ops instead of monkeypatching and amp_C."""

from __future__ import annotations

import sys
import time
import warnings
import weakref

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from ..optimizers.larc import LARC
from . import _state, opt_levels, torch_ddp
from .amp_optimizer import AmpOptimizer
from .loss_scaler import LossScaler
from .masters import HALF, MasterWeights, follow_moves
from .model_casting import (cast_inputs_of_half_modules, cast_module_tensors, keep_state_dict_fp32,
                            module_device_type, patch_forward)

_WRAPPERS = ("DistributedDataParallel", "DataParallel", "FullyShardedDataParallel")


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


def _check_models(models):
    device_types = set()
    for i, model in enumerate(models):
        if type(model).__name__ in _WRAPPERS:
            raise RuntimeError(f"models[{i}] is already wrapped in {type(model).__name__}: call "
                               "amp.initialize on the bare model first, then wrap what it returns")
        if getattr(model, "_core_ops_amp", None) is not None:
            raise RuntimeError(f"models[{i}] was already passed to amp.initialize; initialize each "
                               "model once (to resume, build a fresh model, initialize it, then "
                               "load the checkpoint)")
        for name, p in model.named_parameters():
            if (p.is_floating_point() and p.dtype != torch.float32
                    and not _state._amp_state.allow_incoming_model_not_fp32):
                raise TypeError(f"models[{i}] parameter '{name}' is {p.dtype}; pass the model in "
                                "float32 and let amp.initialize cast it (or set Apex's "
                                "amp._amp_state.allow_incoming_model_not_fp32 = True)")
        device_types.add(module_device_type(model))
    if len(device_types) > 1:
        raise ValueError(f"the models are on different device types {sorted(device_types)}")
    return device_types.pop()


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
            raise ValueError(f"optimizers[{i}] holds none of the parameters of the models passed to "
                             f"initialize (its first has shape {tuple(params[0].shape)}); build the "
                             "optimizer from those models' parameters")
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


def _check_half_supported(device_type, props):
    """Fails early, with advice, when the device cannot compute in the half dtype."""
    uses_half = props.cast_model_type in (torch.float16, torch.bfloat16) or props.patch_torch_functions
    if not uses_half:
        return
    dtype = props.half_dtype
    advice = (f"use half_dtype={'torch.float16' if dtype is torch.bfloat16 else 'torch.bfloat16'} "
              "or opt_level='O0'")
    if device_type == "cuda" and dtype is torch.bfloat16 and not torch.cuda.is_bf16_supported(
            including_emulation=False):
        raise RuntimeError(f"this GPU has no bfloat16 arithmetic (it needs compute capability 8.0+); "
                           f"{advice}")
    try:
        a = torch.ones(8, 8, dtype=dtype, device=device_type)
        torch.mm(a, a)
    except RuntimeError as e:
        raise RuntimeError(f"{dtype} matmul does not run on {device_type} ({e}); {advice}") from None
    if device_type == "cpu" and dtype is torch.float16:
        _warn_if_fp16_is_slow_here()
    if props.patch_torch_functions:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.autocast(device_type, dtype=dtype):
                pass
        if any("autocast" in str(w.message).lower() for w in caught):
            raise RuntimeError(f"torch.autocast on {device_type} does not support {dtype}; {advice}")


_FP16_CPU_CHECKED = []


def _gflops(dtype, n=256, repeats=3):
    """The best of ``repeats`` timed n x n matmuls (the first calls pay set-up)."""
    a = torch.randn(n, n).to(dtype)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, a)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def _warn_if_fp16_is_slow_here():
    """fp16 on a CPU is a trap where it has no fp16 arithmetic (most x86 CPUs before
    AVX512-FP16): torch 2.14 ran 2048^2 matmuls at 0-3 GFLOP/s in fp16 against 111 in
    fp32 and 196 in bf16 on a 2-core x86 machine. Measured here once per process (256^2
    matmuls, about 50 ms where fp16 is slow; float32 as the yardstick, bfloat16's first
    call pays oneDNN's set-up), and said when fp16 is more than twice slower than
    float32; the level is not switched behind the user's back."""
    if _FP16_CPU_CHECKED:
        return
    _FP16_CPU_CHECKED.append(True)
    f16, f32 = _gflops(torch.float16), _gflops(torch.float32, repeats=10)
    if f16 * 2 < f32:
        warnings.warn(f"float16 on this CPU computes slowly: a 256x256 matmul ran at {f16:.1f} GFLOP/s in "
                      f"float16 against {f32:.1f} in float32. Use bfloat16: half_dtype=torch.bfloat16 "
                      "(Lightning: precision='apex-O2-bf16'; Accelerate: CORE_OPS_HALF_DTYPE=bf16)", stacklevel=4)


def _make_masters(models, props, registry=None):
    """fp32 masters of the params that will be half: those the cast turns half, from
    their values before it, or, when the model is not cast, those that came in half
    (added to ``registry`` when given)."""
    registry = MasterWeights() if registry is None else registry
    cast = props.cast_model_type
    for model in models:
        for module in model.modules():
            if cast is not None and props.keep_batchnorm_fp32 and isinstance(module, _BatchNorm):
                continue
            for p in module.parameters(recurse=False):
                half = p.is_floating_point() if cast in HALF else (cast is None and p.dtype in HALF)
                if half and registry.get(p) is None:
                    registry.add(p, torch.nn.Parameter(p.detach().to(torch.float32, copy=True),
                                                       requires_grad=p.requires_grad))
    return registry


def _prepare_model(model, props, registry, handle, inputs_per_module=False):
    """Casts ``model`` for ``props``. Its inputs are cast at its forward, as Apex's
    input caster did, or, with ``inputs_per_module`` (AmpLoop), at the entry of each
    module holding half params (``cast_inputs_of_half_modules``)."""
    half = props.cast_model_type in HALF
    if props.cast_model_type is not None:
        cast_module_tensors(model, props.cast_model_type, half and props.keep_batchnorm_fp32)
    if half and inputs_per_module:
        cast_inputs_of_half_modules(model, props.cast_model_type)
    # O1 keeps autocast whatever cast_model_type says (Apex still patched torch's
    # functions with cast_model_type=torch.float32).
    autocast = props.half_dtype if props.patch_torch_functions else None
    if props.cast_model_type is not None or autocast is not None:
        patch_forward(model, None if inputs_per_module else props.cast_model_type,
                      props.cast_model_outputs or torch.float32, autocast, handle)
    elif props.cast_model_outputs is not None:
        patch_forward(model, None, props.cast_model_outputs, None)
    if half or len(registry):
        keep_state_dict_fp32(model, registry)
        follow_moves(model)
    model._core_ops_amp = props


def _publish(state):
    """Makes ``state`` the one ``amp.state_dict`` and ``amp._amp_state`` report. A call
    with no optimizers (a frozen teacher) does not displace a training call's state;
    ``scale_loss`` reads each optimizer's own call's state anyway."""
    previous = _state._current
    if not state.optimizers and previous is not None and previous.optimizers:
        return
    _state.set_current(state)


def _say(line):
    """One line in one write, tagged with the rank in a distributed run: print() writes
    the text and the newline apart, so two ranks' banners could share a line."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        line = f"[rank {dist.get_rank()}] {line}"
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def initialize(models, optimizers=None, enabled=True, opt_level="O1", cast_model_type=None,
               patch_torch_functions=None, keep_batchnorm_fp32=None, master_weights=None,
               loss_scale=None, cast_model_outputs=None, num_losses=1, verbosity=1,
               min_loss_scale=None, max_loss_scale=2.0**24, half_dtype=torch.float16):
    """Prepares ``models`` and ``optimizers`` for mixed precision at ``opt_level``
    (Apex's table, see ``opt_levels``), returning them in the shape given (a model or
    a list, and the optimizers likewise; only the models when ``optimizers`` is None).

    ``half_dtype`` (new): torch.float16 as Apex, or torch.bfloat16. Explicit arguments
    override the level's defaults; combinations Apex rejected raise ``ValueError``.
    O1 runs each model's forward under ``torch.autocast(half_dtype)`` (no patching of
    torch functions) and returns float32 outputs unless ``cast_model_outputs`` says
    otherwise, so the loss is computed in float32 as under Apex's patched functions.
    ``enabled=False`` returns the arguments untouched and checks nothing (as Apex, so
    ``enabled=args.amp`` works with any other arguments).

    Several calls may coexist (a student at O2, a teacher at O3): each optimizer keeps
    the properties and loss scalers of its own call.
    """
    if not enabled:
        _state.set_current(_state.AmpState(opt_levels.Properties(str(opt_level), enabled=False),
                                           [], [], []))
        return models if optimizers is None else (models, optimizers)
    props = opt_levels.resolve(opt_level, half_dtype, enabled, cast_model_type=cast_model_type,
                               patch_torch_functions=patch_torch_functions,
                               keep_batchnorm_fp32=keep_batchnorm_fp32,
                               master_weights=master_weights, loss_scale=loss_scale,
                               cast_model_outputs=cast_model_outputs)
    model_list, single_model = _as_list(models, torch.nn.Module, "models")
    if optimizers is None:
        opt_list, single_opt = [], True
    else:
        opt_list, single_opt = _as_list(optimizers, (torch.optim.Optimizer, LARC), "optimizers",
                                        allow_empty=True)
    if int(num_losses) < 1:
        raise ValueError(f"num_losses must be >= 1, got {num_losses}")

    device_type = _check_models(model_list)
    _check_optimizers(opt_list, model_list)
    _check_half_supported(device_type, props)

    registry = _make_masters(model_list, props) if props.master_weights else MasterWeights()
    if len(registry):
        torch_ddp.install()  # masters follow torch DDP's broadcast (Note [Masters follow DDP's broadcast])
    handle = _state.O1Handle() if props.patch_torch_functions else _state.NoOpHandle()
    for model in model_list:
        _prepare_model(model, props, registry, handle)
    if props.dynamic:
        scalers = [LossScaler(init_scale=2.0**16, dynamic=True, min_scale=min_loss_scale or 0.0,
                              max_scale=max_loss_scale) for _ in range(int(num_losses))]
    else:
        scalers = [LossScaler(init_scale=props.loss_scale, dynamic=False)
                   for _ in range(int(num_losses))]
    # Weak references: the state must not keep a finished run's models and optimizers
    # alive (a sweep initializes fresh ones again and again).
    state = _state.AmpState(props, scalers, [weakref.ref(m) for m in model_list],
                            [weakref.ref(o) for o in opt_list], handle)
    for opt in opt_list:
        opt._core_ops_amp = AmpOptimizer(opt, registry if props.master_weights else None, state)
    _publish(state)
    if verbosity:
        _say(f"core_ops.amp: {props.opt_level} with {props.half_dtype}: "
             f"cast_model_type={props.cast_model_type}, autocast={props.patch_torch_functions}, "
             f"keep_batchnorm_fp32={props.keep_batchnorm_fp32}, "
             f"master_weights={props.master_weights}, loss_scale={props.loss_scale}")
    ms = model_list[0] if single_model else model_list
    if optimizers is None:
        return ms
    return ms, (opt_list[0] if single_opt else opt_list)
