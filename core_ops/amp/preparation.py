"""What both entry points of amp (``initialize`` and ``AmpLoop``) do to a model:
check it, check the device computes in the half dtype, make the fp32 masters, cast the
model and patch its forward, and publish the state that ``amp.state_dict`` reports.
Models sharded by FSDP2 take their opt level through FSDP2's own mixed precision
(Note [Opt levels on FSDP2] in fsdp.py)."""

from __future__ import annotations

import time
import warnings

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from ..settings import INIT_LOSS_SCALE
from . import _state, fsdp
from .masters import HALF, MasterWeights, follow_moves
from .model_casting import (cast_inputs_of_half_modules, cast_module_tensors, keep_state_dict_fp32,
                            module_device_type, patch_forward)

_WRAPPERS = ("DistributedDataParallel", "DataParallel", "FullyShardedDataParallel")


def check_models(models):
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


def check_half_supported(device_type, props):
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


def make_masters(models, props, registry=None):
    """fp32 masters of the params that will be half: those the cast turns half, from
    their values before it, or, when the model is not cast, those that came in half
    (added to ``registry`` when given). A model sharded by FSDP2 has none: its float32
    shards are its masters (Note [Opt levels on FSDP2])."""
    registry = MasterWeights() if registry is None else registry
    cast = props.cast_model_type
    for model in models:
        if fsdp.is_fully_sharded(model):
            continue
        for module in model.modules():
            if cast is not None and props.keep_batchnorm_fp32 and isinstance(module, _BatchNorm):
                continue
            for p in module.parameters(recurse=False):
                half = p.is_floating_point() if cast in HALF else (cast is None and p.dtype in HALF)
                if half and registry.get(p) is None:
                    registry.add(p, torch.nn.Parameter(p.detach().to(torch.float32, copy=True),
                                                       requires_grad=p.requires_grad))
    return registry


def uncompiled(model):
    """The module ``torch.compile(model)`` wraps (its ``_orig_mod``), else ``model``: amp
    prepares that one in place, and the compiled wrapper, which calls it, traces the
    prepared forward at its first call (a model may be compiled before initialize)."""
    inner = getattr(model, "_orig_mod", None)
    return inner if isinstance(inner, torch.nn.Module) and type(model).__name__ == "OptimizedModule" else model


def remainder_seeds(models, props):
    """{id(param): (param, int16 remainders)} for the params the cast will turn bfloat16,
    from their float32 values before it (master_weights="remainder"): FusedAdam starts
    from the exact float32 weights, as fp32 masters would (Note [Master remainders])."""
    from ..optimizers.compact_state import initial_remainders
    seeds = {}
    if props.cast_model_type is not torch.bfloat16:
        return seeds
    for model in models:
        for module in model.modules():
            if props.keep_batchnorm_fp32 and isinstance(module, _BatchNorm):
                continue
            for p in module.parameters(recurse=False):
                if p.dtype == torch.float32 and id(p) not in seeds:
                    seeds[id(p)] = (p, initial_remainders(p))
    return seeds


def prepare_model(model, props, registry, handle, inputs_per_module=False, where=""):
    """Casts ``model`` for ``props``. Its inputs are cast at its forward, as Apex's
    input caster did, or, with ``inputs_per_module`` (AmpLoop), at the entry of each
    module holding half params (``cast_inputs_of_half_modules``). A model sharded by
    FSDP2 computes in half through FSDP2's mixed-precision policy (O2) or its half
    shards (O3), each unit casting its inputs (Note [Opt levels on FSDP2])."""
    half = props.cast_model_type in HALF
    if half:  # a half model compiled on a CPU meets Note [Inductor's twin reductions]
        from ..torch_patches import inductor_twin_reductions
        inductor_twin_reductions.install_when_imported()
    if fsdp.is_fully_sharded(model):
        fsdp.prepare(model, props, where)
        inputs_per_module = True  # FSDP2's units cast their own inputs
    elif props.cast_model_type is not None:
        cast_module_tensors(model, props.cast_model_type, half and props.keep_batchnorm_fp32)
    if half and inputs_per_module:
        cast_inputs_of_half_modules(model, props.cast_model_type)
    # O1 keeps autocast whatever cast_model_type says (Apex still patched torch's
    # functions with cast_model_type=torch.float32).
    autocast = props.half_dtype if props.patch_torch_functions else None
    if props.cast_model_type is not None or autocast is not None:
        patch_forward(model, None if inputs_per_module else props.cast_model_type,
                      props.cast_model_outputs or torch.float32, autocast, handle,
                      has_masters=any(registry.get(p) is not None for p in model.parameters()))
    elif props.cast_model_outputs is not None:
        patch_forward(model, None, props.cast_model_outputs, None)
    if half or len(registry):
        keep_state_dict_fp32(model, registry)
        follow_moves(model)
    model._core_ops_amp = props


def publish(state):
    """Makes ``state`` the one ``amp.state_dict`` and ``amp._amp_state`` report. A call
    with no optimizers (a frozen teacher) does not displace a training call's state;
    ``scale_loss`` reads each optimizer's own call's state anyway."""
    previous = _state._current
    if not state.optimizers and previous is not None and previous.optimizers:
        return
    _state.set_current(state)


def make_state(props, num_losses=1, routed=None):
    """The AmpState of ``props`` with no model or optimizer yet: a loss scaler per loss
    (dynamic from Apex's 2**16, or the fixed scale), a SkipWatch per scaler, and O1's
    handle; ``initialize`` and ``AmpLoop`` both start from it."""
    from .loss_scaler import LossScaler
    from .skip_watch import SkipWatch
    if props.dynamic:
        scalers = [LossScaler(init_scale=INIT_LOSS_SCALE, dynamic=True, min_scale=props.min_loss_scale or 0.0,
                              max_scale=props.max_loss_scale) for _ in range(num_losses)]
    else:
        scalers = [LossScaler(init_scale=props.loss_scale, dynamic=False) for _ in range(num_losses)]
    handle = _state.O1Handle() if props.patch_torch_functions else _state.NoCastsHandle()
    watches = [SkipWatch(props.max_consecutive_skips, props.skip_report_seconds) for _ in scalers]
    return _state.AmpState(props, scalers, [], [], handle, watches, routed)
