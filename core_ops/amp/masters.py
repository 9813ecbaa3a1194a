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

import torch

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

    def adopt_written(self):
        """Takes the half value of each param into its master where the two differ: the
        half param was written after ``initialize`` other than through a state-dict
        load (``param.copy_``, ``param.data = ...``), which the masters cannot see.
        Apex made its masters from the half weights at the first backward, so such
        writes were trained from; here they are too (rounded, as in Apex)."""
        with torch.no_grad():
            for param, master in list(self._by_id.values()):
                if not torch.equal(param.detach(), master.detach().to(param.dtype)):
                    master.copy_(param.detach())

    def get_or_make(self, param):
        """``param``'s master; a half param that has none (a group added after
        ``initialize``) gets one from its current values, as Apex's patched
        ``add_param_group`` did. Float32 params have no master."""
        master = self.get(param)
        if master is None and param.dtype in HALF:
            master = torch.nn.Parameter(param.detach().float(), requires_grad=param.requires_grad)
            self.add(param, master)
        return master


def of(module):
    """The registry of an initialized model (an empty one for a model without masters)."""
    return getattr(module, "_core_ops_amp_masters", None) or MasterWeights()
