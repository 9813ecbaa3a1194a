"""``ApexDDPStrategy`` (``strategy="apex-ddp"`` / ``"apex-ddp_spawn"``), written once for
the Trainer and Fabric of both Lightning trees: Lightning's own DDP strategy with the
model wrapped in core_ops' DistributedDataParallel (bucketed allreduce overlapped with
backward, Apex's options) and, for ``sync_batchnorm=True``, core_ops' SyncBatchNorm,
which runs on CPU (gloo) as well as CUDA. ``strategy_classes(tree)`` makes the pair.
``ApexFSDPStrategy`` (``strategy="apex-fsdp"``): Lightning's FSDP2 strategy
(ModelParallelStrategy) sharding the model itself, with Apex's opt levels."""

from __future__ import annotations

import contextlib

import torch

from core_ops.amp import fsdp
from core_ops.parallel import DistributedDataParallel, convert_syncbn_model, revert_syncbn_model
from core_ops.parallel.distributed import check_options

# core_ops DistributedDataParallel's options, reachable on the strategy instance.
DDP_OPTIONS = dict(message_size=10_000_000, delay_allreduce=False, allreduce_always_fp32=False,
                   allreduce_dtype=None, gradient_average=True, gradient_predivide_factor=1.0,
                   retain_allreduce_buffers=False, broadcast_buffers=True)
# Lightning's own DDPStrategy arguments, passed through.
STRATEGY_ARGS = ("accelerator", "parallel_devices", "cluster_environment", "checkpoint_io",
                 "precision_plugin", "precision", "process_group_backend", "timeout", "start_method")


def _split(options, where):
    """(core_ops DDP options, Lightning strategy args) of ``options``; torch-DDP-only
    arguments get an error that says what the strategy takes instead."""
    ddp = {k: options.pop(k) for k in list(options) if k in DDP_OPTIONS}
    # core_ops' DDP always finds unused params itself and always reduces into bucket
    # views; these two torch flags have nothing left to choose.
    for flag in ("find_unused_parameters", "gradient_as_bucket_view"):
        options.pop(flag, None)
    unknown = sorted(k for k in options if k not in STRATEGY_ARGS)
    if unknown:
        raise TypeError(f"{where} got {unknown}, arguments of torch's DistributedDataParallel; "
                        f"core_ops' takes {', '.join(DDP_OPTIONS)} (use strategy='ddp' for torch's)")
    check_options(**{k: ddp[k] for k in ("message_size", "allreduce_always_fp32", "allreduce_dtype",
                                         "gradient_predivide_factor") if k in ddp})
    return {**DDP_OPTIONS, **ddp}, options


def _wrap(strategy, module):
    return DistributedDataParallel(module, **strategy.apex_ddp_options)


def _register(cls, registry, description):
    for name, start_method in (("apex-ddp", "popen"), ("apex-ddp_spawn", "spawn")):
        if name not in registry:
            registry.register(name, cls, description=f"{description} (start_method {start_method!r})",
                              start_method=start_method)


def _fsdp_options(auto_wrap_policy, reduce_dtype, options, where):
    """The set of classes ``auto_wrap_policy`` names, the checks of both FSDP strategies."""
    policy = (set(auto_wrap_policy or ()) if isinstance(auto_wrap_policy, (set, frozenset, list, tuple, type(None)))
              else None)
    if policy is None or not all(isinstance(c, type) and issubclass(c, torch.nn.Module) for c in policy):
        raise TypeError(f"{where}(auto_wrap_policy=...) takes a set of nn.Module classes to shard one by "
                        f"one (e.g. {{Block}}), got {auto_wrap_policy!r}")
    if reduce_dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"{where}(reduce_dtype=...) must be torch.float32, torch.float16 or "
                         f"torch.bfloat16, got {reduce_dtype!r}")
    for name in ("data_parallel_size", "tensor_parallel_size"):
        if name in options:
            raise TypeError(f"{where} shards over all processes and takes no {name}; use "
                            "ModelParallelStrategy with precision='apex-O2' for tensor parallelism")
    return policy


def _shard(strategy, module):
    """``module`` given to ``fully_shard`` as ``strategy`` says, unless it already holds
    FSDP2 units (a ``configure_model`` or a ``parallelize_fn`` sharded it)."""
    if fsdp.units(module):
        return module
    from torch.distributed.fsdp import fully_shard
    loop = getattr(strategy.precision_plugin if hasattr(strategy, "precision_plugin") else strategy.precision,
                   "loop", None)
    options = dict(mesh=strategy.device_mesh["data_parallel"], reshard_after_forward=strategy.reshard_after_forward)
    if loop is not None:
        options["mp_policy"] = fsdp.fsdp_policy(loop.opt_level, loop.half_dtype, strategy.reduce_dtype)
    for sub in reversed(list(module.modules())):  # innermost first, as FSDP2 asks
        if sub is not module and type(sub) in strategy.auto_wrap_policy:
            fully_shard(sub, **options)
    fully_shard(module, **options)
    return module


class _FabricClipping:
    """``fabric.clip_gradients`` under Apex's precision: the loop's clipping (unscaled
    first, the true global norm in one pass, shards' too; an overflow skips the step)."""

    def clip_gradients_norm(self, module, optimizer, max_norm, norm_type=2.0, error_if_nonfinite=True):
        loop = getattr(self.precision, "loop", None)
        if loop is None or norm_type != 2.0:
            return super().clip_gradients_norm(module, optimizer, max_norm, norm_type, error_if_nonfinite)
        return loop.clip_grad_norm_(optimizer, max_norm)


class _FSDPOptions:
    """What the Trainer's and Fabric's ``apex-fsdp`` share: Lightning's
    ModelParallelStrategy (FSDP2) over every process as one data-parallel mesh, the
    model sharded by the strategy: each module of a class in ``auto_wrap_policy`` (a
    set of classes, e.g. ``{Block}``) is given to ``fully_shard``, then the root, with
    ``reshard_after_forward`` and, under ``precision="apex-O2"``, FSDP2's mixed precision
    for the opt level (``core_ops.amp.fsdp_policy``: params gathered in half, grads
    reduced in ``reduce_dtype``). A model already sharded (by ``configure_model``) is
    left as it is. Checkpoints are torch.distributed.checkpoint folders, or one full
    file with ``save_distributed_checkpoint=False``, as Lightning's."""

    strategy_name = "apex-fsdp"

    def _take_options(self, auto_wrap_policy, reshard_after_forward, reduce_dtype, options):
        self.auto_wrap_policy = _fsdp_options(auto_wrap_policy, reduce_dtype, options, "ApexFSDPStrategy")
        self.reshard_after_forward, self.reduce_dtype = bool(reshard_after_forward), reduce_dtype

    def setup_environment(self):
        self._data_parallel_size, self._tensor_parallel_size = self.num_nodes * self.num_processes, 1
        super().setup_environment()

    @classmethod
    def register_strategies(cls, strategy_registry):
        if "apex-fsdp" not in strategy_registry:
            strategy_registry.register("apex-fsdp", cls, description="FSDP2 with core_ops' opt levels")


class _ApexFSDP(_FSDPOptions):
    """The Trainer's ``strategy="apex-fsdp"``; the model is sharded in ``configure_model``
    (the Trainer calls it after setting up the processes, before the precision casts)."""

    def __init__(self, auto_wrap_policy=None, reshard_after_forward=True, reduce_dtype=torch.float32,
                 **options):
        self._take_options(auto_wrap_policy, reshard_after_forward, reduce_dtype, options)
        super().__init__(**options)

    def setup_environment(self):
        super().setup_environment()
        module = self.lightning_module
        own = type(module).configure_model

        def configure_model():  # the Trainer calls it next: the model is sharded there
            own(module)
            _shard(self, module)

        module.configure_model = configure_model

    def teardown(self):
        module = self.lightning_module
        if module is not None:
            module.__dict__.pop("configure_model", None)
        super().teardown()


class _ApexFabricFSDP(_FabricClipping, _FSDPOptions):
    """Fabric's ``strategy="apex-fsdp"``: ``fabric.setup_module(model)`` shards the model,
    then prepares it for the opt level (Fabric converts a module for its precision
    before its strategy sees it: under this strategy that waits for the shards, which
    are then the O2 masters); optimizers are made of the sharded params after it, as
    with Lightning's ModelParallelStrategy."""

    def __init__(self, auto_wrap_policy=None, reshard_after_forward=True, reduce_dtype=torch.float32,
                 **options):
        self._take_options(auto_wrap_policy, reshard_after_forward, reduce_dtype, options)
        super().__init__(parallelize_fn=self._parallelize, **options)

    @property
    def precision(self):
        return super().precision

    @precision.setter
    def precision(self, plugin):
        self._precision = plugin
        if hasattr(plugin, "loop"):
            plugin.converts_after_sharding = True  # convert_module leaves it to _parallelize

    def _parallelize(self, module, mesh):
        _shard(self, module)
        loop = getattr(self.precision, "loop", None)
        return module if loop is None else loop.prepare_model(module)


def strategy_classes(trainer_pkg, fabric_pkg, module_name):
    """(Trainer ApexDDPStrategy, Fabric ApexDDPStrategy, CoreOpsSyncBatchNorm, Fabric's
    backward-sync control) of one tree, named in ``module_name`` (the Fabric ones are
    moved to their own module by _trees.py; picklable for ``apex-ddp_spawn``)."""
    TrainerDDP = trainer_pkg.strategies.DDPStrategy
    FabricDDP = fabric_pkg.strategies.DDPStrategy
    LayerSync = trainer_pkg.plugins.LayerSync
    TorchSyncBatchNorm = trainer_pkg.plugins.TorchSyncBatchNorm
    BackwardSyncControl = fabric_pkg.strategies.strategy._BackwardSyncControl

    class CoreOpsSyncBatchNorm(LayerSync):
        """``sync_batchnorm=True`` under ``apex-ddp``: core_ops' SyncBatchNorm."""

        def apply(self, model):
            return convert_syncbn_model(model)

        def revert(self, model):
            return revert_syncbn_model(model)

    class ApexDDPStrategy(TrainerDDP):
        """Lightning's DDPStrategy with core_ops' DistributedDataParallel: its options
        (``message_size``, ``delay_allreduce``, ``allreduce_always_fp32``,
        ``allreduce_dtype=torch.bfloat16``, ``gradient_predivide_factor``, ...) go
        here, beside Lightning's own (``start_method``, ``timeout``, ...)."""

        strategy_name = "apex-ddp"

        def __init__(self, **options):
            self.apex_ddp_options, options = _split(options, "ApexDDPStrategy")
            super().__init__(**options)

        @property
        def _layer_sync(self):
            return self.__dict__.get("_apex_layer_sync")

        @_layer_sync.setter
        def _layer_sync(self, value):  # the Trainer hands it torch's for sync_batchnorm=True
            self.__dict__["_apex_layer_sync"] = (CoreOpsSyncBatchNorm() if isinstance(value, TorchSyncBatchNorm)
                                                 else value)

        def _setup_model(self, model):
            return _wrap(self, model)

        def _register_ddp_hooks(self):
            pass  # torch DDP's comm hooks; core_ops' reduces in its own buckets

        @contextlib.contextmanager
        def block_backward_sync(self):
            context = self.model.no_sync() if isinstance(self.model, DistributedDataParallel) else contextlib.nullcontext()
            with context:
                yield

        def teardown(self):
            if isinstance(self.model, DistributedDataParallel):
                self.model = self.lightning_module  # unwrap, as Lightning does torch's
            super().teardown()

        @classmethod
        def register_strategies(cls, strategy_registry):
            _register(cls, strategy_registry, "core_ops' DistributedDataParallel")

    class _NoSync(BackwardSyncControl):
        def no_backward_sync(self, module, enabled):
            if not enabled:
                return contextlib.nullcontext()
            if not isinstance(module, DistributedDataParallel):
                raise TypeError("no_backward_sync needs the module set up by the apex-ddp strategy "
                                f"(core_ops' DistributedDataParallel), got {type(module).__name__}")
            return module.no_sync()

    class ApexFabricDDPStrategy(_FabricClipping, FabricDDP):
        """Fabric's DDPStrategy with core_ops' DistributedDataParallel (options as the
        Trainer's ApexDDPStrategy); ``fabric.no_backward_sync`` and
        ``fabric.clip_gradients`` work as with Lightning's own."""

        def __init__(self, **options):
            self.apex_ddp_options, options = _split(options, "ApexDDPStrategy")
            super().__init__(**options)
            self._backward_sync_control = _NoSync()

        def setup_module(self, module):
            return _wrap(self, module)

        @classmethod
        def register_strategies(cls, strategy_registry):
            _register(cls, strategy_registry, "core_ops' DistributedDataParallel")

    ApexFSDPStrategy = type("ApexFSDPStrategy", (_ApexFSDP, trainer_pkg.strategies.ModelParallelStrategy),
                            {"__doc__": _FSDPOptions.__doc__})
    ApexFabricFSDPStrategy = type("ApexFSDPStrategy", (_ApexFabricFSDP, fabric_pkg.strategies.ModelParallelStrategy),
                                  {"__doc__": _FSDPOptions.__doc__ + "\n\n" + _ApexFabricFSDP.__doc__})
    for cls, name in ((CoreOpsSyncBatchNorm, "CoreOpsSyncBatchNorm"), (ApexDDPStrategy, "ApexDDPStrategy"),
                      (ApexFabricDDPStrategy, "ApexDDPStrategy"), (_NoSync, "_NoSync"),
                      (ApexFSDPStrategy, "ApexFSDPStrategy"), (ApexFabricFSDPStrategy, "ApexFSDPStrategy")):
        cls.__module__, cls.__qualname__, cls.__name__ = module_name, name, name
    return (ApexDDPStrategy, ApexFabricDDPStrategy, CoreOpsSyncBatchNorm, _NoSync, ApexFSDPStrategy,
            ApexFabricFSDPStrategy)
