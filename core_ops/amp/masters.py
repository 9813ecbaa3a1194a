"""The fp32 master weights of one ``initialize`` call (O2), looked up by the half param
they shadow.

Note [Master registry]: the model (its ``state_dict`` hooks and ``zero_grad``) and the
optimizer (``add_param_group``) find masters here, through the param object itself,
never through a list captured when ``initialize`` ran. So a group added later gets a
master the model's ``state_dict`` also reports; every name of a tied param maps to the
same master; and a ``copy.deepcopy`` of the model (an EMA or best-model snapshot)
gets an empty registry: its params are new objects without masters, so its
``state_dict`` is its own half weights upcast (as in Apex) and nothing it does reaches
the original's masters.
"""

from __future__ import annotations

import types

import torch

from .._flat_collectives import flat_broadcast
from ..torch_patches import ddp_init_broadcast

HALF = (torch.float16, torch.bfloat16)


class MasterWeights:
    def __init__(self):
        self._by_id = {}  # id(half param) -> (half param, master); the param is kept alive

    def __deepcopy__(self, memo):
        return MasterWeights()  # see the note: a copy trains nothing of the original's

    def __len__(self):
        return len(self._by_id)

    def add(self, param, master):
        self._by_id[id(param)] = (param, master)

    def get(self, param):
        entry = self._by_id.get(id(param))
        return entry[1] if entry is not None and entry[0] is param else None

    def adopt_written(self, params=None):
        """Takes writes to the half params (of ``params``, default all) into their
        masters, element by element (Note [Writes to O2 half params])."""
        with torch.no_grad():
            for param, master in list(self._by_id.values()):
                if params is None or id(param) in params:
                    master.copy_(merged(param, master))

    def get_or_make(self, param):
        """``param``'s master; a half param that has none (a group added after
        ``initialize``) gets one from its current values, as Apex's patched
        ``add_param_group`` did. Float32 params have no master."""
        master = self.get(param)
        if master is None and param.dtype in HALF:
            master = torch.nn.Parameter(param.detach().float(), requires_grad=param.requires_grad)
            self.add(param, master)
        return master


# Note [Writes to O2 half params]: at O2 the model holds half weights that each step
# overwrites from the fp32 masters, so a write to them between steps (a param.copy_,
# an EMA or SWA callback putting averaged weights in, a weight clamp under no_grad, a
# fit at another precision) would be lost at the next step and missing from the state
# dict, which reports the masters. So an element whose half value differs from its
# master's rounding was written: the state dict reports the half value there (the
# master everywhere else, with its extra bits), and before each backward the
# optimizer's masters take it (AmpOptimizer.adopt_written_weights, for params whose
# version counter moved since the last step; all of them at the first).

def merged(param, master):
    """The fp32 value of a half param: its master where the master still rounds to it,
    the half value where the param was written since (Note [Writes to O2 half params])."""
    half, full = param.detach(), master.detach()
    return torch.where(full.to(half.dtype) == half, full, half.to(full.dtype))


def of(module):
    """The registry of an initialized model (an empty one for a model without masters)."""
    return getattr(module, "_core_ops_amp_masters", None) or MasterWeights()


def follow_moves(model):
    """After ``model.to(device)`` (any ``_apply``) the masters move to their half
    params' devices too, in place: a framework prepares the model on the CPU and moves
    it to its GPU afterwards (Lightning's strategies, Fabric). A bound method, so a
    deepcopy's moves serve the copy."""
    model._apply = types.MethodType(_apply_and_move_masters, model)


def _apply_and_move_masters(self, fn, *args, **kwargs):
    out = type(self)._apply(self, fn, *args, **kwargs)
    with torch.no_grad():
        for param, master in list(of(self)._by_id.values()):
            if master.device != param.device:
                master.data = master.data.to(param.device)
                if master.grad is not None:
                    master.grad = master.grad.to(param.device)
    return out


def named_in(module, skip=()):
    """[(name, master)] of ``module``'s params that have fp32 masters, found through the
    registries of ``module`` and its submodules (the initialized model may be a part of
    the one given), params named in ``skip`` left out."""
    registries = [r for m in module.modules() if (r := getattr(m, "_core_ops_amp_masters", None))]
    found = []
    for name, p in module.named_parameters():
        master = next((m for r in registries if (m := r.get(p)) is not None), None)
        if master is not None and name not in skip:
            found.append((name, master))
    return found


def broadcast(module, group, src, skip=()):
    """Gives every rank of ``group`` the fp32 masters of global rank ``src``, exactly,
    for the params of ``module`` a data-parallel wrapper has just broadcast (Note
    [Masters follow DDP's broadcast]). One flat broadcast; nothing without masters."""
    found = named_in(module, skip)
    if found:
        with torch.no_grad():
            flat_broadcast([m.data for _, m in found], group, src)


# Note [Masters follow DDP's broadcast]: a DistributedDataParallel makes every rank
# start from rank 0's weights by broadcasting the params, which at O2 are the half
# weights; the fp32 masters, made by initialize from each rank's own float32 weights,
# stay as they were (Apex made its masters lazily from the broadcast half weights, and
# so rounded rank 0's weights through half). Every rank then steps from different
# masters and the run stops being data-parallel: one half ulp apart at step 0, more
# with every step. So the masters are broadcast too, once, right after the params:
# by core_ops' DistributedDataParallel in its construction, and for torch's
# DistributedDataParallel by the patch torch_patches/ddp_init_broadcast.py, which
# initialize installs when it makes masters.
ddp_init_broadcast.follow(broadcast)
