"""Where the plugin reaches into Accelerate, all in one place.

``Accelerator.__init__`` maps every kwargs handler class it knows to an attribute and
rejects any other, and has no registry. So ``Accelerator.__init__`` is wrapped once
(idempotent: a marker on the wrapper, ``functools.wraps`` so ``__wrapped__`` leads
back; ``uninstall`` undoes it): an ``ApexPlugin`` is taken out of ``kwargs_handlers``
before Accelerate reads them, and once the Accelerator is built it is checked
(``mixed_precision`` must be "no"; DeepSpeed, FSDP, Megatron-LM, XLA and fp8 cannot run
with it), its class becomes ``accelerator.with_apex(...)`` of its own, and the plugin
is registered for checkpointing. Under ``python -m core_ops_accelerate`` an Accelerator
built without one gets ``ApexPlugin()`` when ``CORE_OPS_OPT_LEVEL`` is set.

The supported Accelerate range and every method relied on are checked first
(``problems``); if anything differs nothing is patched, importing the plugin warns, and
``Accelerator(kwargs_handlers=[ApexPlugin()])`` raises Accelerate's own error.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys

import accelerate
from accelerate import Accelerator
from packaging.version import Version

from .accelerator import _ApexMethods, with_apex
from .plugin import ApexPlugin

SUPPORTED = ("1.15", "2")  # [lowest, first unsupported) Accelerate release
_MARK = "_core_ops_takes_apex"
INCOMPATIBLE = ("DEEPSPEED", "FSDP", "MEGATRON_LM", "XLA")
AUTO = {"on": False}  # set by ``python -m core_ops_accelerate``


def problems():
    """What in the installed Accelerate differs from what the plugin relies on."""
    found = []
    version = Version(accelerate.__version__)
    if not Version(SUPPORTED[0]) <= version < Version(SUPPORTED[1]):
        found.append(f"accelerate {version} is outside the supported [{SUPPORTED[0]}, {SUPPORTED[1]})")
    if "kwargs_handlers" not in inspect.signature(Accelerator.__init__).parameters:
        found.append("Accelerator.__init__ takes no kwargs_handlers")
    for name, params in (("prepare", ("device_placement",)),
                         ("prepare_model", ("model", "device_placement", "evaluation_mode")),
                         ("prepare_optimizer", ("optimizer", "device_placement")),
                         ("prepare_scheduler", ("scheduler",)), ("backward", ("loss",)),
                         ("unscale_gradients", ("optimizer",)),
                         ("clip_grad_norm_", ("parameters", "max_norm", "norm_type")),
                         ("clip_grad_value_", ("parameters", "clip_value")),
                         ("unwrap_model", ("model", "keep_fp32_wrapper", "keep_torch_compile")),
                         ("autocast", ("autocast_handler",)), ("register_for_checkpointing", ())):
        method = getattr(Accelerator, name, None)
        if method is None or not set(params) <= set(inspect.signature(method).parameters):
            found.append(f"Accelerator.{name} is not what the plugin knows")
    for attr in ("_models", "_optimizers", "gradient_accumulation_steps", "use_distributed", "device_placement"):
        if attr not in inspect.unwrap(Accelerator.__init__).__code__.co_names and not hasattr(Accelerator, attr):
            found.append(f"Accelerator has no {attr}")
    return found


def _check(accelerator):
    if str(accelerator.mixed_precision) != "no":
        raise ValueError(f"ApexPlugin runs core_ops' mixed precision; Accelerate's own must be off: "
                         f"mixed_precision={accelerator.mixed_precision!r} (from the argument, the config or "
                         "ACCELERATE_MIXED_PRECISION) must be 'no'")
    kind = str(getattr(accelerator.distributed_type, "value", accelerator.distributed_type))
    if kind == "FSDP" and getattr(accelerator, "is_fsdp2", False):
        return  # FSDP2: the opt level takes the sharded model (accelerator.py, _prepare_sharded)
    if kind in INCOMPATIBLE:
        raise ValueError(f"ApexPlugin cannot run with {kind} (it shards, casts or compiles the model its own "
                         "way); use single-process or multi-GPU / multi-CPU data parallelism, or, to shard "
                         "the model, FSDP2: FullyShardedDataParallelPlugin(fsdp_version=2) "
                         "(accelerate launch --use_fsdp --fsdp_version 2)")
    if getattr(accelerator, "has_fp8_handler", False):
        raise ValueError("ApexPlugin cannot run with an fp8 recipe handler")


def _enable(accelerator, plugin):
    _check(accelerator)
    accelerator.__class__ = with_apex(type(accelerator))
    accelerator._core_ops_apex = plugin
    accelerator._core_ops_twins = {}
    accelerator.register_for_checkpointing(plugin)


def _wrap(init):
    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        handlers = list(bound.arguments.get("kwargs_handlers") or [])
        ours = [h for h in handlers if isinstance(h, ApexPlugin)]
        if len(ours) > 1:
            raise ValueError("You can only pass one ApexPlugin in `kwargs_handlers`.")
        if not ours and AUTO["on"] and not isinstance(self, _ApexMethods):
            ours = _from_environment()
        if ours:
            bound.arguments["kwargs_handlers"] = [h for h in handlers if not isinstance(h, ApexPlugin)] or None
        init(*bound.args, **bound.kwargs)
        if ours:
            _enable(self, ours[0])

    setattr(__init__, _MARK, True)
    return __init__


def _from_environment():
    """[ApexPlugin()] when CORE_OPS_OPT_LEVEL is set; [] when no variable of the plugin
    is; else an error: a variable set without an opt level would do nothing (Note
    [Settings that stop the run])."""
    from core_ops import settings
    given = settings.set_in_environment((settings.AMP, settings.PLUGINS, settings.ACCELERATE, settings.DDP))
    if "CORE_OPS_OPT_LEVEL" in given:
        plugin = ApexPlugin()
        _announce(plugin)
        return [plugin]
    if given:
        said = ", ".join(f"{k}={v!r}" for k, v in given.items())
        # Remainders are bf16's: their fix names the dtype too.
        bf16 = given.get("CORE_OPS_MASTER_WEIGHTS", "").strip().lower() == "remainder" and \
            "CORE_OPS_HALF_DTYPE" not in given
        raise ValueError(f"core-ops: {said} {'is' if len(given) == 1 else 'are'} set but CORE_OPS_OPT_LEVEL is "
                         f"not, so nothing would read {'it' if len(given) == 1 else 'them'}: set "
                         f"CORE_OPS_OPT_LEVEL=O2{' CORE_OPS_HALF_DTYPE=bf16' if bf16 else ''} (O0-O3), or pass "
                         f"kwargs_handlers=[ApexPlugin(opt_level=...)], or unset {', '.join(given)}")
    return []


def _announce(plugin):
    """Says once, on rank 0, that core-ops switched itself on from the environment and
    every setting it runs with: nothing else in a script's output would show it."""
    if AUTO.get("announced") or os.environ.get("RANK", "0") != "0":
        return
    AUTO["announced"] = True
    from core_ops import settings
    print(f"core-ops: every Accelerator runs with ApexPlugin({settings.describe(plugin.settings)})",
          file=sys.stderr, flush=True)


def install():
    """Wraps Accelerator.__init__ (once); returns the problems that stopped it."""
    found = problems()
    if found:
        return found
    if not getattr(Accelerator.__init__, _MARK, False):
        Accelerator.__init__ = _wrap(Accelerator.__init__)
    return []


def uninstall():
    if getattr(Accelerator.__init__, _MARK, False):
        Accelerator.__init__ = Accelerator.__init__.__wrapped__
