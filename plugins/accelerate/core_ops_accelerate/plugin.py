"""``ApexPlugin``: the kwargs handler that switches core_ops on in an Accelerator. Its
fields are the settings that Accelerate's route reads (``core_ops.settings``: the opt
level and its options, the plugins' ``fused_optimizer``, ``sync_bn``, and core_ops
DistributedDataParallel's options), made from that one declaration: a field left None
takes its ``CORE_OPS_*`` variable (which ``accelerate launch`` passes to every process),
else the plugins' default; bad values, from code or the environment, are errors that
name what the user wrote."""

from __future__ import annotations

import dataclasses
from typing import Any

from accelerate.utils import KwargsHandler

from core_ops import settings
from core_ops._forwarding import forwarded
from core_ops.amp import AmpLoop
from core_ops.parallel import DDPOptions

FIELDS = settings.ROUTES["accelerate"]
DDP_OPTIONS = settings.names(settings.DDP)


def _post_init(self):
    self.settings = settings.resolve("accelerate", {name: getattr(self, name) for name in FIELDS})
    for name, value in self.settings.values.items():
        setattr(self, name, value)
    self._ddp = DDPOptions(**{k: self.settings[k] for k in DDP_OPTIONS})  # checked here, at construction
    self.loop = AmpLoop(routed=self.settings)


def _ddp_options(self):
    return self._ddp.as_kwargs()


# ---- what Accelerator.save_state / load_state keep (register_for_checkpointing)

def _state_dict(self):
    return self.loop.state_dict()


def _load_state_dict(self, state_dict):
    self.loop.load_state_dict(state_dict)


def _to_dict(self):  # KwargsHandler's: the options, without the loop
    return {name: getattr(self, name) for name in FIELDS}


ApexPlugin = dataclasses.make_dataclass(
    "ApexPlugin", [(name, Any, None) for name in FIELDS], bases=(KwargsHandler,),
    namespace={"__post_init__": _post_init, "ddp_options": _ddp_options, "state_dict": _state_dict,
               "load_state_dict": _load_state_dict,
               "loss_scale_value": forwarded("loop", "loss_scale", "The current loss scale, a float (a host sync)."),
               "skipped_steps": forwarded("loop", "skipped_steps", "Optimizer steps skipped for inf / nan grads so "
                                                                   "far (a host sync)."), "to_dict": _to_dict,
               "__module__": __name__})
ApexPlugin.__doc__ = (
    "core_ops in an Accelerator: ``Accelerator(kwargs_handlers=[ApexPlugin(opt_level=\"O2\")])``.\n\n"
    "Its fields (each None by default: the variable, else the plugins' default):\n\n" +
    "\n".join(f"- ``{s.name}`` (``{s.env}``): {s.doc}" for s in settings.SETTINGS if s.name in FIELDS))
