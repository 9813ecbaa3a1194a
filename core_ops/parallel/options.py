"""The options of core_ops' data parallelism, declared once: ``DDPOptions`` for
DistributedDataParallel (Apex's defaults) and ``FSDPOptions`` for sharding a model
with FSDP2 under an opt level. Each checks and parses itself at construction, so a
framework's strategy or plugin that takes them fails at its own construction, long
before a model is wrapped; the Apex alias, both plugins and DistributedDataParallel's
own signature take their defaults from here."""

from __future__ import annotations

import dataclasses

import torch

from .. import settings
from ..amp import fsdp

def _setting(name, value):
    """``value`` of option ``name`` through its setting's parser (its checks and words)."""
    return settings.BY_NAME[name].parse(value, name)


@dataclasses.dataclass(frozen=True)
class DDPOptions:
    """DistributedDataParallel's options (Apex's, and ``allreduce_dtype``,
    ``broadcast_buffers``), checked: ``DDPOptions(message_size=2**24)``. ``split`` takes
    them out of a dict of keyword arguments."""

    # The defaults of the options that are also settings (a CORE_OPS_* variable each)
    # are the settings' (Note [One declaration per setting]).
    message_size: int = settings.BY_NAME["message_size"].default
    delay_allreduce: bool = settings.BY_NAME["delay_allreduce"].default
    allreduce_always_fp32: bool = settings.BY_NAME["allreduce_always_fp32"].default
    allreduce_dtype: torch.dtype | None = settings.BY_NAME["allreduce_dtype"].default
    num_allreduce_streams: int = 1
    gradient_average: bool = True
    gradient_predivide_factor: float = settings.BY_NAME["gradient_predivide_factor"].default
    retain_allreduce_buffers: bool = False
    broadcast_buffers: bool = True

    def __post_init__(self):
        # The options that are settings take the setting's parser (Note [One declaration
        # per setting]); the others are checked here, flags by the same parser.
        for name in ("message_size", "delay_allreduce", "allreduce_always_fp32", "gradient_predivide_factor"):
            object.__setattr__(self, name, _setting(name, getattr(self, name)))
        if self.allreduce_dtype is not None:
            object.__setattr__(self, "allreduce_dtype", _setting("allreduce_dtype", self.allreduce_dtype))
        if not isinstance(self.num_allreduce_streams, int) or self.num_allreduce_streams < 1:
            raise ValueError(f"num_allreduce_streams must be >= 1, got {self.num_allreduce_streams!r}")
        for name in ("gradient_average", "retain_allreduce_buffers", "broadcast_buffers"):
            object.__setattr__(self, name, settings.flag(getattr(self, name), name))
        if self.allreduce_always_fp32 and self.allreduce_dtype not in (None, torch.float32):
            raise ValueError(f"allreduce_always_fp32=True contradicts allreduce_dtype={self.allreduce_dtype}; give "
                             "one of them")

    @classmethod
    def names(cls):
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def split(cls, options):
        """(DDPOptions of the entries of ``options`` that are its fields, the rest)."""
        mine = {k: v for k, v in options.items() if k in cls.names()}
        return cls(**mine), {k: v for k, v in options.items() if k not in mine}

    def as_kwargs(self):
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class FSDPOptions:
    """How a model is sharded by FSDP2 under an opt level: each module of a class in
    ``auto_wrap_policy`` (a set of nn.Module classes, e.g. ``{Block}``) becomes a unit,
    innermost first, then the root; ``reshard_after_forward`` as ``fully_shard``'s; grads
    reduced in ``reduce_dtype`` (at O2: ``core_ops.amp.fsdp_policy``); ``cpu_offload``:
    True, or an FSDP2 ``OffloadPolicy`` (``CPUOffloadPolicy(pin_memory=...)``), keeps the
    shards of params and grads, and so the optimizer's step and state, on the CPU."""

    auto_wrap_policy: frozenset = frozenset()
    reshard_after_forward: bool = True
    reduce_dtype: torch.dtype = torch.float32
    cpu_offload: object = False

    def __post_init__(self):
        policy = self.auto_wrap_policy
        classes = (frozenset(policy or ()) if isinstance(policy, (set, frozenset, list, tuple, type(None)))
                   else None)
        if classes is None or not all(isinstance(c, type) and issubclass(c, torch.nn.Module) for c in classes):
            raise TypeError(f"auto_wrap_policy takes a set of nn.Module classes to shard one by one (e.g. "
                            f"{{Block}}), got {policy!r}")
        object.__setattr__(self, "auto_wrap_policy", classes)
        object.__setattr__(self, "reshard_after_forward",
                           settings.flag(self.reshard_after_forward, "reshard_after_forward"))
        object.__setattr__(self, "reduce_dtype", settings.dtype_of(
            self.reduce_dtype, "reduce_dtype", (torch.float32, torch.float16, torch.bfloat16)))
        object.__setattr__(self, "cpu_offload", _offload_policy(self.cpu_offload))

    def shard(self, module, mesh=None, opt_level=None, half_dtype=torch.float16, root=True):
        """``module`` sharded by FSDP2 over ``mesh`` (the default: every process), with
        the mixed precision of ``opt_level`` when given; a module that already holds
        FSDP2 units (sharded by its owner) is returned as it is. ``root=False``: the
        module's children holding params become the outermost units, and the module
        itself one only if it holds params of its own: for a module whose children are
        called directly (a LightningModule's ``training_step`` calling ``self.model(x)``
        would otherwise meet the root's params still sharded, its forward not run)."""
        from torch.distributed.fsdp import fully_shard
        if fsdp.units(module):
            return module
        options = dict(mesh=mesh, reshard_after_forward=self.reshard_after_forward)
        if self.cpu_offload is not None:
            options["offload_policy"] = self.cpu_offload
        if opt_level is not None:
            options["mp_policy"] = fsdp.fsdp_policy(opt_level, half_dtype, self.reduce_dtype)
        for sub in reversed(list(module.modules())):  # innermost first, as FSDP2 asks
            if sub is not module and type(sub) in self.auto_wrap_policy:
                fully_shard(sub, **options)
        if root or any(True for _ in module.parameters(recurse=False)):
            return fully_shard(module, **options)
        for child in module.children():
            if not isinstance(child, fsdp.fsdp_module_type()) and any(True for _ in child.parameters()):
                fully_shard(child, **options)
        return module


def _offload_policy(value):
    """FSDP2's offload policy for ``cpu_offload`` (None: fully_shard's default, none).
    True pins the CPU shards only where CUDA is there: pinned memory serves the copies
    to a GPU, and pinning needs a CUDA driver (torch's default CPUOffloadPolicy() fails
    in fully_shard on a CPU-only machine, "Found no NVIDIA driver")."""
    if value is False:  # (FSDP2 not imported: a strategy is made before torch.distributed is needed)
        return None
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy
    if isinstance(value, OffloadPolicy):
        return value
    if value is True:
        return CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    raise TypeError(f"cpu_offload takes True, False or an FSDP2 OffloadPolicy (e.g. "
                    f"torch.distributed.fsdp.CPUOffloadPolicy(pin_memory=False)), got {value!r}")
