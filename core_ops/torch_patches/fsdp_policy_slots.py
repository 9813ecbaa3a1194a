"""Where each torch release keeps an FSDP2 unit's mixed-precision policy: the one
private corner of FSDP2 that ``amp.initialize`` writes to (Note [Opt levels on FSDP2]).

Note [FSDP2 policy slots]: ``fully_shard(module, mp_policy=...)`` stores the policy in
the unit's ``FSDPState._mp_policy`` (it casts the unit's inputs and outputs) and in its
param group, whose params take their gathered and reduced dtypes from it at the root's
lazy init (``FSDPParam.init_dtype_attrs``). ``fully_shard`` has no setter, so a unit
sharded without a policy gets one by writing every slot FSDP2 may read before that
init. The slots, read from each release's ``_fully_shard`` sources:

  torch 2.6 - 2.9    ``state._fsdp_param_group``, one group or None (a unit holding no
                     params); ``group.mp_policy`` is read at lazy init
  torch 2.14         ``state._fsdp_param_groups``, a list; ``group.mp_policy`` is read
  torch 2.15         the list; each ``FSDPParam.mp_policy`` is read (resolved per param),
                     the group keeps none

Each FSDPParam has held an ``mp_policy`` since 2.6, so writing every slot that exists
covers all of them. A release that moves them again is one more case in ``param_groups``
or ``slots``; ``verify`` checks at the first forward that the gathered dtypes are the
policy's, so a layout this module misreads is an error, never a model silently
computing in float32. Switched off, or on a release outside ``PATCH.torch``, ``write``
raises instead, naming the route that needs no patch (``mp_policy=`` at ``fully_shard``).
"""

from __future__ import annotations

import torch

from ._patch import Patch

WHEN_OFF = ("amp.initialize cannot give an FSDP2 unit sharded without one a mixed-precision policy, so O2 refuses "
            "it: shard it with fully_shard(..., mp_policy=core_ops.amp.fsdp_policy(opt_level, half_dtype)), as "
            "the Lightning and Accelerate plugins do.")
PATCH = Patch(__name__, ("2.10", "2.16"), "tools/upstream/fsdp2_no_policy_setter.py", WHEN_OFF)


class LayoutError(RuntimeError):
    """This torch keeps FSDP2's policy where this module does not look."""


def _missing(what):
    return LayoutError(f"this torch ({torch.__version__}) keeps FSDP2's mixed-precision policy elsewhere "
                       f"({what} not found): shard the model with fully_shard(..., "
                       "mp_policy=core_ops.amp.fsdp_policy(opt_level, half_dtype)) before amp.initialize")


def state_of(unit):
    """The unit's FSDPState, checked for the fields every layout has."""
    state = unit._get_fsdp_state()
    for name in ("_mp_policy", "_is_root"):
        if not hasattr(state, name):
            raise _missing(f"FSDPState.{name}")
    return state


def param_groups(state):
    """The unit's FSDPParamGroups (none for a unit without params of its own)."""
    if hasattr(state, "_fsdp_param_groups"):  # 2.14, 2.15 (2.15 also has the singular, a property)
        return list(state._fsdp_param_groups)
    if hasattr(state, "_fsdp_param_group"):  # 2.6 - 2.9
        group = state._fsdp_param_group
        return [] if group is None else [group]
    raise _missing("FSDPState._fsdp_param_groups")


def slots(state):
    """Every (object, attribute) that holds the unit's policy."""
    found = [(state, "_mp_policy")]
    for group in param_groups(state):
        params = getattr(group, "fsdp_params", None)
        if params is None:
            raise _missing("FSDPParamGroup.fsdp_params")
        if hasattr(group, "mp_policy"):  # before 2.15
            found.append((group, "mp_policy"))
        elif not all(hasattr(p, "mp_policy") for p in params):
            raise _missing("FSDPParamGroup.mp_policy")
        found += [(p, "mp_policy") for p in params if hasattr(p, "mp_policy")]
    return found


def write(state, policy):
    """Sets ``policy`` in every slot of the unit's ``state`` (Note [FSDP2 policy slots])."""
    if not PATCH.active():
        raise LayoutError(f"core_ops.torch_patches.fsdp_policy_slots is off in this run: {PATCH.when_off}")
    for owner, name in slots(state):
        setattr(owner, name, policy)


def verify(unit, policy):
    """After the unit's first pre-forward (FSDP2's lazy init has run): its params gather
    in the policy's dtype. Raises LayoutError otherwise."""
    for group in param_groups(unit._get_fsdp_state()):
        for p in group.fsdp_params:
            orig = getattr(p, "orig_dtype", None)
            want = None if policy.param_dtype in (None, orig) else policy.param_dtype
            got = getattr(p, "param_dtype", want)
            if got != want:
                raise LayoutError(f"this torch ({torch.__version__}) did not take the mixed-precision policy "
                                  f"amp.initialize set on the FSDP2 unit {type(unit).__name__}: its params "
                                  f"gather in {got or orig}, not {want or orig}. Shard the model with "
                                  "fully_shard(..., mp_policy=core_ops.amp.fsdp_policy(opt_level, half_dtype)) "
                                  "before amp.initialize")
