"""Where the plugin reaches into Lightning, all in one place.

Lightning checks ``precision=`` against a fixed list and has no registry for it, so the
``apex-*`` names are made to work by one wrap of each connector's ``__init__`` (the
Trainer's ``_AcceleratorConnector`` and Fabric's ``_Connector``, in every installed
tree): an ``apex-*`` name becomes an ``ApexPrecision`` in ``plugins`` before Lightning
reads the arguments, and once the connector is built it checks that its strategy can
run Apex's precision. Strategies go through Lightning's public registries.

Everything relied on is checked first (``problems``); if anything is off, nothing is
patched and importing the plugin warns, pointing to ``plugins=[ApexPrecision(...)]``.
The patch is idempotent (a marker on the wrapper, ``functools.wraps`` so
``__wrapped__`` leads back) and undone by ``uninstall``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import logging
import inspect
import os
import sys
import weakref

import torch
from packaging.version import Version

from . import names

SUPPORTED = ("2.6", "2.7")  # [lowest, first unsupported) Lightning release
_MARK = "_core_ops_apex_names"
# Strategies that cannot run Apex's precision: their own precision plugins shard,
# compile or cast differently (class names, so that an uninstalled one costs nothing).
INCOMPATIBLE = ("FSDPStrategy", "DeepSpeedStrategy", "XLAStrategy", "SingleDeviceXLAStrategy",
                "XLAFSDPStrategy")
# Fabric converts a module for its precision before its strategy shards it: O2's masters
# would be made of the whole model. The Trainer shards first (configure_model).
INCOMPATIBLE_WITH_FABRIC = ("ModelParallelStrategy",)


@dataclasses.dataclass(frozen=True)
class Tree:
    """One of Lightning's package trees and the places the plugin uses in it."""

    name: str
    trainer: object  # lightning.pytorch or pytorch_lightning
    fabric: object  # lightning.fabric or lightning_fabric
    trainer_connector: type
    fabric_connector: type


_TREES = {"lightning": ("lightning.pytorch", "lightning.fabric"),
          "pytorch_lightning": ("pytorch_lightning", "lightning_fabric")}


def installed_trees():
    """The trees importable here, as ``Tree``s (missing ones are left out)."""
    found = []
    shared = _rank_zero_module()
    before = getattr(shared, "log", None)
    if before is not None and before.name == shared.__name__:
        before = None  # its own default: no tree had set it
    for name, (trainer_name, fabric_name) in _TREES.items():
        try:
            trainer, fabric = importlib.import_module(trainer_name), importlib.import_module(fabric_name)
            tc = importlib.import_module(f"{trainer_name}.trainer.connectors.accelerator_connector")
            fc = importlib.import_module(f"{fabric_name}.connector")
        except ImportError:
            continue
        found.append(Tree(name, trainer, fabric, tc._AcceleratorConnector, fc._Connector))
    # Importing a tree points Lightning's shared rank-zero logger at that tree's own: keep
    # the one of the tree the user imported (else lightning's), or importing the plugin
    # would move Lightning's messages away from logging.getLogger("lightning.pytorch").
    if shared is not None and found:
        shared.log = before or logging.getLogger(f"{_TREES[found[0].name][0]}.utilities.rank_zero")
    return found


def _rank_zero_module():
    """The module whose ``log`` Lightning's rank_zero_info writes to."""
    try:
        return importlib.import_module("lightning_utilities.core.rank_zero")
    except ImportError:
        return None


def problems(tree):
    """What in ``tree`` differs from what the plugin relies on (empty: all is well)."""
    found = []
    version = Version(tree.trainer.__version__)
    if not Version(SUPPORTED[0]) <= version < Version(SUPPORTED[1]):
        found.append(f"{tree.name} {version} is outside the supported [{SUPPORTED[0]}, {SUPPORTED[1]})")
    for cls in (tree.trainer_connector, tree.fabric_connector):
        params = inspect.signature(cls.__init__).parameters
        if not {"precision", "plugins", "strategy"} <= set(params):
            found.append(f"{cls.__qualname__}.__init__ no longer takes precision / plugins / strategy")
    ddp = tree.trainer.strategies.DDPStrategy
    for attr in ("_setup_model", "_register_ddp_hooks", "block_backward_sync", "configure_ddp", "teardown"):
        if not hasattr(ddp, attr):
            found.append(f"the Trainer's DDPStrategy has no {attr}")
    if not hasattr(tree.fabric.strategies.DDPStrategy, "setup_module"):
        found.append("Fabric's DDPStrategy has no setup_module")
    for registry in (tree.trainer.strategies.StrategyRegistry, tree.fabric.strategies.STRATEGY_REGISTRY):
        if not callable(getattr(registry, "register", None)):
            found.append(f"{tree.name}'s strategy registry has no register()")
    return found


def _plugins_list(plugins):
    if plugins is None:
        return []
    return list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]


def _check_strategy_name(strategy, registry_names, what):
    close = names.strategy_near_miss(strategy, registry_names())
    if close:
        raise ValueError(f"{what}(strategy={strategy!r}): did you mean {close!r}? core_ops_lightning's strategies "
                         f"are {', '.join(names.STRATEGIES)}")


def _from_environment(bound, precision, plugins, base_precision, what):
    """Note [Settings that stop the run], in Lightning: the precision of a Trainer or
    Fabric, given the ``CORE_OPS_*`` variables. ``CORE_OPS_OPT_LEVEL`` with no precision
    given makes it ``apex-*`` (an ApexPrecision whose settings come from the
    variables); with another precision given, or another amp variable set while no
    apex precision runs, nothing would read them: an error says what to write instead.
    ``CORE_OPS_SYNC_BN`` is the Trainer's ``sync_batchnorm``. The DDP variables are the
    apex-ddp strategy's (``_check_ddp_variables``)."""
    from core_ops import settings
    given = settings.set_in_environment((settings.AMP, settings.PLUGINS))
    _sync_bn_from_environment(bound, what)
    apex = names.is_ours(precision) or any(isinstance(p, _apex_types()) for p in plugins)
    if not given or apex:
        return precision
    routed = settings.resolve("lightning")  # a bad value stops here, naming its variable
    said = ", ".join(f"{k}={v!r}" for k, v in given.items())
    others = [p for p in plugins if isinstance(p, base_precision)]
    if "CORE_OPS_OPT_LEVEL" in given and precision is None and not others:
        return _announced(routed, what)
    # The name to write: the variables' level and dtype (remainders are bf16's).
    bf16 = routed["half_dtype"] == torch.bfloat16 or routed["master_weights"] == "remainder"
    name = names.name_of(routed["opt_level"], torch.bfloat16 if bf16 else torch.float16)
    runs = (f"precision={precision!r}" if precision is not None else
            f"plugins={others}" if others else "Lightning's default precision")
    raise ValueError(f"core-ops: {said} {'is' if len(given) == 1 else 'are'} set, but this {what} runs {runs}, "
                     f"so nothing would read {'it' if len(given) == 1 else 'them'}. In Lightning, core-ops' opt "
                     f"level is the precision: write {what}(precision={name!r}) (the variables then fill the "
                     "options it leaves unset), or leave precision unset and set CORE_OPS_OPT_LEVEL, or unset "
                     f"{', '.join(given)}")


def _announced(routed, what):
    """The apex-* name that CORE_OPS_OPT_LEVEL gives, said once on rank 0 with every
    setting it runs with (the "active" line)."""
    from core_ops import settings
    name = names.name_of(routed["opt_level"], routed["half_dtype"])
    if os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) == "0" and not _ANNOUNCED.get(what):
        _ANNOUNCED[what] = True
        print(f"core-ops: every {what} runs precision={name!r}: ApexPrecision({settings.describe(routed)})",
              file=sys.stderr, flush=True)
    return name


_ANNOUNCED = {}


def _sync_bn_from_environment(bound, what):
    from core_ops import settings
    text = settings.set_in_environment((settings.ACCELERATE,)).get("CORE_OPS_SYNC_BN", "").strip()
    if not text:
        return
    wanted = settings.flag(text, "CORE_OPS_SYNC_BN")
    if what == "Fabric":
        raise ValueError(f"core-ops: CORE_OPS_SYNC_BN={text!r} is set, but Fabric has no sync_batchnorm: convert the "
                         "model yourself (core_ops.parallel.convert_syncbn_model(model)), or unset it")
    if bound.arguments.get("sync_batchnorm") and not wanted:  # (the Trainer always passes it; False: unset)
        raise ValueError(f"core-ops: Trainer(sync_batchnorm={bound.arguments['sync_batchnorm']!r}) and "
                         f"CORE_OPS_SYNC_BN={text!r} disagree: give one of them")
    bound.arguments["sync_batchnorm"] = wanted


def _check_ddp_variables(strategy, what):
    """The variables of core_ops' DistributedDataParallel are read by the apex-ddp
    strategy; under another one they would do nothing."""
    from core_ops import settings
    given = settings.set_in_environment((settings.DDP,))
    if given and not getattr(strategy, "_core_ops_reads_ddp_settings", False):
        said = ", ".join(f"{k}={v!r}" for k, v in given.items())
        raise ValueError(f"core-ops: {said} {'is' if len(given) == 1 else 'are'} set, but this {what} runs "
                         f"{type(strategy).__name__}, which does not read {'it' if len(given) == 1 else 'them'}: "
                         f"pass strategy='apex-ddp' (core_ops' DistributedDataParallel), or unset "
                         f"{', '.join(given)}")


def _wrap_connector(init, precision_cls, base_precision, plugin_attr, what, registry_names):
    """The connector's ``__init__``, taking ``apex-*`` names (see the module note);
    ``plugin_attr`` is where the built connector keeps its precision plugin."""
    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        precision, plugins = bound.arguments.get("precision"), _plugins_list(bound.arguments.get("plugins"))
        ours = [p for p in plugins if isinstance(p, _apex_types())]
        if not names.is_ours(precision) and names.near_miss(precision):
            raise ValueError(f"{what}(precision={precision!r}): did you mean {names.near_miss(precision)!r}? "
                             f"core_ops_lightning's precisions are {', '.join(names.NAMES)}")
        _check_strategy_name(bound.arguments.get("strategy"), registry_names, what)
        precision = _from_environment(bound, precision, plugins, base_precision, what)
        if names.is_ours(precision):
            names.parse(precision)  # an unknown name: an error naming the valid ones
            others = [p for p in plugins if isinstance(p, base_precision) and not isinstance(p, _apex_types())]
            if others or ours:
                raise ValueError(f"{what}(precision={precision!r}) and plugins={others + ours} both set the "
                                 "precision; give one of them")
            plugins.append(precision_cls(precision))
            bound.arguments["precision"] = None
        # An ApexPrecision of another tree or of the other class (Trainer / Fabric) is
        # rebuilt as this one, with its options.
        plugins = [precision_cls(**p.options) if isinstance(p, _apex_types()) and not isinstance(p, precision_cls)
                   else p for p in plugins]
        if ours or names.is_ours(precision):
            bound.arguments["plugins"] = plugins
        init(*bound.args, **bound.kwargs)
        _check_ddp_variables(self.strategy, what)
        precision_plugin = getattr(self, plugin_attr, None)
        if isinstance(precision_plugin, _apex_types()):
            strategy = self.strategy
            if type(strategy).__name__ in INCOMPATIBLE or (
                    what == "Fabric" and type(strategy).__name__ in INCOMPATIBLE_WITH_FABRIC):
                raise ValueError(f"{what}(precision={precision_plugin.precision!r}) cannot run with "
                                 f"{type(strategy).__name__}: use a single device, 'ddp', 'apex-ddp' (or "
                                 "their _spawn forms), or, to shard the model, 'apex-fsdp' (FSDP2; "
                                 "ModelParallelStrategy too)")
            if what == "Fabric":
                strategy.__class__ = _attaching(type(strategy))

    setattr(__init__, _MARK, True)
    return __init__


# Note [Fabric's optimizers]: Fabric shows a precision plugin no optimizer before its
# first step, but an optimizer must step the masters before anything else touches it:
# a fabric.load() into it would otherwise cast the saved fp32 state to the half
# params' dtype. So the strategy of a Fabric with ApexPrecision gets, in place, a
# subclass whose setup_optimizer() attaches the optimizer (and whose
# setup_module_and_optimizers() makes a scheduler given with them hold still after a
# skipped step); a pickle of it (ddp_spawn) rebuilds the same.
_ATTACHING = {}


def _attaching(cls):
    if getattr(cls, "_core_ops_attaches", False):
        return cls
    if cls not in _ATTACHING:
        def setup_optimizer(self, optimizer):
            optimizer = cls.setup_optimizer(self, optimizer)
            self.precision.loop.attach(optimizer)
            return optimizer

        def setup_module_and_optimizers(self, module, optimizers, scheduler=None):
            out = cls.setup_module_and_optimizers(self, module, optimizers, scheduler)
            if scheduler is not None:
                self.precision.loop.follow_skips(scheduler)
            return out

        def __reduce_ex__(self, protocol):
            # The state third: pickle makes the object before its state, which (the
            # launcher) refers back to it.
            return _new_attaching, (cls,), self.__getstate__()

        _ATTACHING[cls] = type(cls.__name__, (cls,), {
            "setup_optimizer": setup_optimizer, "setup_module_and_optimizers": setup_module_and_optimizers,
            "__reduce_ex__": __reduce_ex__, "_core_ops_attaches": True,
            "__module__": cls.__module__, "__qualname__": cls.__qualname__})
    return _ATTACHING[cls]


def _new_attaching(cls):
    return cls.__new__(_attaching(cls))


def _introducing_fabric(init):
    """Fabric's ``__init__``, after which its ApexPrecision knows the Fabric (weakly), to
    log the loss scale and skipped steps through its loggers: the Trainer logs them
    itself, Fabric shows its precision plugin neither loggers nor steps."""
    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        precision = getattr(self, "_precision", None)
        if isinstance(precision, _apex_types()):
            precision.fabric = weakref.ref(self)

    setattr(__init__, _MARK, True)
    return __init__


_APEX_TYPES = []


def _apex_types():
    return tuple(_APEX_TYPES)


def install(classes_by_tree):
    """Patches every tree of ``classes_by_tree`` ({Tree: namespace with ApexPrecision,
    ApexFabricPrecision, ApexDDPStrategy, ApexFabricDDPStrategy}) and registers the
    strategies; returns the problems that stopped it (nothing is patched then)."""
    found = [p for tree in classes_by_tree for p in problems(tree)]
    if found:
        return found
    for tree, ns in classes_by_tree.items():
        _APEX_TYPES.extend(c for c in (ns.ApexPrecision, ns.ApexFabricPrecision) if c not in _APEX_TYPES)
        for cls, precision_cls, base, attr, what, registry in (
                (tree.trainer_connector, ns.ApexPrecision, tree.trainer.plugins.precision.Precision,
                 "precision_plugin", "Trainer", tree.trainer.strategies.StrategyRegistry.available_strategies),
                (tree.fabric_connector, ns.ApexFabricPrecision, tree.fabric.plugins.precision.Precision,
                 "precision", "Fabric", tree.fabric.strategies.STRATEGY_REGISTRY.available_strategies)):
            if not getattr(cls.__init__, _MARK, False):
                cls.__init__ = _wrap_connector(cls.__init__, precision_cls, base, attr, what, registry)
        if not getattr(tree.fabric.Fabric.__init__, _MARK, False):
            tree.fabric.Fabric.__init__ = _introducing_fabric(tree.fabric.Fabric.__init__)
        ns.ApexDDPStrategy.register_strategies(tree.trainer.strategies.StrategyRegistry)
        ns.ApexFSDPStrategy.register_strategies(tree.trainer.strategies.StrategyRegistry)
        ns.ApexFabricDDPStrategy.register_strategies(tree.fabric.strategies.STRATEGY_REGISTRY)
        ns.ApexFabricFSDPStrategy.register_strategies(tree.fabric.strategies.STRATEGY_REGISTRY)
    return []


def uninstall(classes_by_tree):
    """Undoes ``install`` (for tests): the connectors' own ``__init__`` and registries back."""
    for tree in classes_by_tree:
        for cls in (tree.trainer_connector, tree.fabric_connector, tree.fabric.Fabric):
            if getattr(cls.__init__, _MARK, False):
                cls.__init__ = cls.__init__.__wrapped__
        for registry in (tree.trainer.strategies.StrategyRegistry, tree.fabric.strategies.STRATEGY_REGISTRY):
            for name in ("apex-ddp", "apex-ddp_spawn"):
                registry.pop(name, None)
