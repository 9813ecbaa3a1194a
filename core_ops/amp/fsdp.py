"""Apex's opt levels on models sharded by torch's FSDP2 (``fully_shard``).

Note [Opt levels on FSDP2]: FSDP2 keeps each rank's shard of every param (a DTensor)
and gathers the whole params of a unit (a module given to ``fully_shard``) for its
forward and backward. O2 there needs no masters of its own: the float32 shards are the
masters, and FSDP2's MixedPrecisionPolicy gathers them in the half dtype (the model
computes in half, as Apex's O2) and reduce-scatters the grads in ``reduce_dtype``,
landing in float32 on the shards. The optimizer then steps float32 shards, so masters
and optimizer state take 1/N of their memory on each of N ranks, and checkpoints hold
float32 values. O3 casts the shards themselves to half (no masters, as Apex's O3); O1
runs the forward under autocast on float32 shards; O0 changes nothing.

BatchNorm at O2 (``keep_batchnorm_fp32``): a unit gathers all its params in one dtype,
so a BatchNorm is kept float32 when it is a unit of its own (``fully_shard(bn)`` before
the enclosing module): it takes float32 inputs and gives half outputs. A unit holding
BatchNorm beside other layers is refused with that route.

FSDP2 reads a unit's policy when the root first runs forward (its lazy init), and
``fully_shard`` offers no setter: ``initialize`` sets the policy of units that still
have the default one, before that first forward, in the private slots each torch
release keeps it in (Note [FSDP2 policy slots], torch_patches/fsdp_policy_slots.py),
and checks at that forward that FSDP2 took it (``FSDPState._is_root`` is None until
then). O3's cast of the shards needs that first forward still to come as well: FSDP2
takes the cast params then. Models sharded with ``mp_policy=fsdp_policy(...)`` (what
the Lightning and Accelerate plugins do) need no private attribute.
"""

from __future__ import annotations

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from .._sharded import is_sharded
from ..torch_patches import fsdp_policy_slots as slots
from .masters import HALF


def fsdp_module_type():
    if not torch.distributed.is_available():
        return ()
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch < 2.6
        return ()
    return FSDPModule


def units(model):
    """The FSDP2 units in ``model`` (modules ``fully_shard`` was applied to), outermost first."""
    kind = fsdp_module_type()
    return [m for m in model.modules() if kind and isinstance(m, kind)]


def is_fully_sharded(model):
    return bool(units(model))


def fsdp_policy(opt_level="O2", half_dtype=torch.float16, reduce_dtype=torch.float32):
    """The ``MixedPrecisionPolicy`` to give ``fully_shard`` for ``opt_level``: at O2
    params gathered in ``half_dtype`` and grads reduced in ``reduce_dtype`` (float32 by
    default, as FSDP2 advises; ``half_dtype`` halves the reduce-scatter's bytes, and a
    sum that overflows fp16 is then a skipped step); at O0, O1 and O3 FSDP2's default
    (no cast: O3 casts the shards themselves). BatchNorm units kept float32 get theirs
    from ``initialize``."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from .opt_levels import half_dtype_of
    if str(opt_level) != "O2":
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=half_dtype_of(half_dtype), reduce_dtype=reduce_dtype)


def check_shardable(model, where):
    """Every param of a model with FSDP2 units must be in one: a plain param beside
    them would be float32 among half activations at O2 and stepped whole on each rank."""
    for name, p in model.named_parameters():
        if not is_sharded(p):
            raise ValueError(f"{where}parameter '{name}' is not sharded while the model has FSDP2 "
                             "units: call fully_shard on the root module too (after its blocks), "
                             "so that FSDP2 manages every parameter")


def _own_modules(unit, kind):
    """The modules whose params ``unit`` gathers: itself and descendants, except the
    subtrees of nested units."""
    yield unit
    for child in unit.children():
        if not isinstance(child, kind):
            yield from _own_modules(child, kind)


def _unrun_state(unit, where):
    state = slots.state_of(unit)
    if state._is_root is not None:
        raise RuntimeError(f"{where}{type(unit).__name__} has already run forward, when FSDP2 fixes "
                           "its params' dtypes: call amp.initialize before the first forward (for O2 "
                           "you may shard with fully_shard(..., mp_policy=core_ops.amp.fsdp_policy(...)))")
    return state


def _set_policy(unit, policy, where):
    slots.write(_unrun_state(unit, where), policy)

    def check_once(module, args):  # runs after FSDP2's own pre-forward hook: its lazy init is done
        handle.remove()
        slots.verify(module, policy)

    handle = unit.register_forward_pre_hook(check_once)


def prepare(model, props, where="models[0]: "):
    """Makes the FSDP2-sharded ``model`` compute at ``props``'s level (Note [Opt levels
    on FSDP2]); the caller patches its forward (outputs, O1's autocast) as for any model."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    for unit in units(model):
        _unrun_state(unit, where)
    check_shardable(model, where)
    half = props.cast_model_type if props.cast_model_type in HALF else None
    if half is None:
        return
    kind = fsdp_module_type()
    for unit in units(model):
        own = list(_own_modules(unit, kind))
        holders = [m for m in own if any(True for _ in m.parameters(recurse=False))]
        norms = [m for m in holders if isinstance(m, _BatchNorm)]
        keep = props.keep_batchnorm_fp32 and norms
        if keep and len(norms) < len(holders):
            raise ValueError(f"{where}the FSDP2 unit {type(unit).__name__} holds BatchNorm "
                             f"({type(norms[0]).__name__}) beside other layers, and a unit is gathered "
                             "in one dtype: keep_batchnorm_fp32 needs each BatchNorm sharded on its "
                             "own first (fully_shard(bn) for each, then the blocks and the root), or "
                             "pass keep_batchnorm_fp32=False")
        if not props.fp32_masters:  # O3, or remainders: the shards themselves are half
            for m in own:
                if not (keep and isinstance(m, _BatchNorm)):
                    m._apply(lambda t: t.to(half) if t.is_floating_point() else t, recurse=False)
            continue
        current = slots.state_of(unit)._mp_policy
        if keep:
            _set_policy(unit, MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32,
                                                   output_dtype=half), where)
            continue
        if current.param_dtype is None:
            _set_policy(unit, MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32), where)
        elif current.param_dtype != half:
            raise ValueError(f"{where}the FSDP2 unit {type(unit).__name__} gathers params in "
                             f"{current.param_dtype} (its mp_policy) but the opt level computes in "
                             f"{half}: shard with mp_policy=core_ops.amp.fsdp_policy('O2', {half})")
        for m in own:  # buffers (not sharded) in the unit's dtype, as O2 casts them
            for name, b in m.named_buffers(recurse=False):
                if b is not None and b.is_floating_point():
                    setattr(m, name, b.to(half))
