"""``ApexDDPStrategy`` (``strategy="apex-ddp"`` / ``"apex-ddp_spawn"``), written once for
the Trainer and Fabric of both Lightning trees: Lightning's own DDP strategy with the
model wrapped in core_ops' DistributedDataParallel (bucketed allreduce overlapped with
backward, Apex's options) and, for ``sync_batchnorm=True``, core_ops' SyncBatchNorm,
which runs on CPU (gloo) as well as CUDA; and ``ApexFSDPStrategy``
(``strategy="apex-fsdp"``): Lightning's FSDP2 strategy (ModelParallelStrategy) sharding
the model itself, with Apex's opt levels. Each is a mixin here, made into a class of
each Lightning tree by ``strategy_classes``, as ``precision.py`` does."""

from __future__ import annotations

import contextlib

import torch

from core_ops import checkpoints, settings
from core_ops.parallel import (DDPOptions, DistributedDataParallel, FSDPOptions, convert_syncbn_model,
                               revert_syncbn_model)
# Lightning's own DDPStrategy arguments, passed through.
STRATEGY_ARGS = ("accelerator", "parallel_devices", "cluster_environment", "checkpoint_io",
                 "precision_plugin", "precision", "process_group_backend", "timeout", "start_method")


def _split(options, where):
    """(core_ops DDP options, Lightning strategy args) of ``options``; torch-DDP-only
    arguments get an error that says what the strategy takes instead."""
    given = {k: options.pop(k) for k in settings.ROUTES["lightning-ddp"] if k in options}
    # The settings of core_ops' DDP (message_size, ...): each left unset takes its
    # CORE_OPS_* variable (Note [One declaration per setting]); the rest are DDPOptions'.
    routed = settings.resolve("lightning-ddp", given)
    ddp, options = DDPOptions.split(dict(options, **routed.values))
    # core_ops' DDP always finds unused params itself and always reduces into bucket
    # views; these two torch flags have nothing left to choose.
    for flag in ("find_unused_parameters", "gradient_as_bucket_view"):
        options.pop(flag, None)
    unknown = sorted(k for k in options if k not in STRATEGY_ARGS)
    if unknown:
        raise TypeError(f"{where} got {unknown}, arguments of torch's DistributedDataParallel; "
                        f"core_ops' takes {', '.join(DDPOptions.names())} (use strategy='ddp' for torch's)")
    return ddp, options


def _register_ddp(cls, registry, description):
    for name, start_method in (("apex-ddp", "popen"), ("apex-ddp_spawn", "spawn")):
        if name not in registry:
            registry.register(name, cls, description=f"{description} (start_method {start_method!r})",
                              start_method=start_method)


def _naming_lost_ranks(call, name, *args, **kwargs):
    """``call(*args, **kwargs)``; an error it raises while a rank of the group is gone
    (Note [Naming a lost rank]) names that rank; any other error is raised as it is."""
    try:
        return call(*args, **kwargs)
    except (RuntimeError, TimeoutError) as e:
        import torch.distributed as dist
        if not dist.is_initialized() or isinstance(e, LostRank):
            raise
        from core_ops.parallel import lost_ranks
        said = lost_ranks.diagnosis()
        if not said.endswith("gone") and "unreachable" not in said:
            raise
        raise LostRank(f"{name} failed on rank {dist.get_rank()}: {said}. Resume from the last checkpoint "
                       "(trainer.fit(..., ckpt_path=\"last\")). The backend said: "
                       f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e


class LostRank(RuntimeError):
    """A collective of the strategy failed because a process of the group is gone."""


def _naming_lost_ranks_in(cls, strategy, methods):
    """Wraps each of ``methods`` of the mixin ``cls`` (its next class's, in the MRO of the
    strategy it is mixed into) in ``_naming_lost_ranks``."""
    def wrapped(method):
        def call(self, *args, **kwargs):
            return _naming_lost_ranks(getattr(super(cls, self), method), f"{strategy}: the {method}", *args,
                                      **kwargs)
        call.__name__ = call.__qualname__ = method
        return call

    for method in methods:
        setattr(cls, method, wrapped(method))


class _SyncBatchNorm:
    """``sync_batchnorm=True`` under ``apex-ddp``: core_ops' SyncBatchNorm."""

    def apply(self, model):
        return convert_syncbn_model(model)

    def revert(self, model):
        return revert_syncbn_model(model)


class _ApexDDP:
    """Lightning's DDPStrategy with core_ops' DistributedDataParallel: its options
    (``message_size``, ``delay_allreduce``, ``allreduce_always_fp32``,
    ``allreduce_dtype=torch.bfloat16``, ``gradient_predivide_factor``, ...; ``DDPOptions``)
    go here, beside Lightning's own (``start_method``, ``timeout``, ...)."""

    strategy_name = "apex-ddp"
    _core_ops_reads_ddp_settings = True  # the CORE_OPS_* variables of DDP (_compat._check_ddp_variables)
    _torch_sync_bn = _our_sync_bn = None  # the tree's classes, set by strategy_classes

    def __init__(self, **options):
        self.apex_ddp, options = _split(options, "ApexDDPStrategy")
        super().__init__(**options)

    @property
    def apex_ddp_options(self):
        return self.apex_ddp.as_kwargs()

    @property
    def _layer_sync(self):
        return self.__dict__.get("_apex_layer_sync")

    @_layer_sync.setter
    def _layer_sync(self, value):  # the Trainer hands it torch's for sync_batchnorm=True
        self.__dict__["_apex_layer_sync"] = self._our_sync_bn() if isinstance(value, self._torch_sync_bn) else value

    def _setup_model(self, model):
        return DistributedDataParallel(model, **self.apex_ddp_options)

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

    def save_checkpoint(self, checkpoint, filepath, storage_options=None):
        """Lightning's, written atomically to a local path (Note [Atomic checkpoints]): a
        rank killed while writing leaves the previous checkpoint, never a torn one that
        ``ckpt_path="last"`` would take. Another CheckpointIO, or a remote path, is
        Lightning's as given."""
        if (type(self.checkpoint_io).__name__ != "TorchCheckpointIO" or storage_options is not None
                or "://" in str(filepath)):
            return super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)
        if self.is_global_zero:
            checkpoints.save(checkpoint, filepath)
        return None

    @classmethod
    def register_strategies(cls, strategy_registry):
        _register_ddp(cls, strategy_registry, "core_ops' DistributedDataParallel")


class _NoSync:
    """Fabric's ``no_backward_sync`` under ``apex-ddp``: core_ops DDP's ``no_sync()``."""

    def no_backward_sync(self, module, enabled):
        if not enabled:
            return contextlib.nullcontext()
        if not isinstance(module, DistributedDataParallel):
            raise TypeError("no_backward_sync needs the module set up by the apex-ddp strategy "
                            f"(core_ops' DistributedDataParallel), got {type(module).__name__}")
        return module.no_sync()


class _FabricClipping:
    """``fabric.clip_gradients`` under Apex's precision: the loop's clipping (unscaled
    first, the true global norm in one pass, shards' too; an overflow skips the step)."""

    def clip_gradients_norm(self, module, optimizer, max_norm, norm_type=2.0, error_if_nonfinite=True):
        loop = getattr(self.precision, "loop", None)
        if loop is None or norm_type != 2.0:
            return super().clip_gradients_norm(module, optimizer, max_norm, norm_type, error_if_nonfinite)
        return loop.clip_grad_norm_(optimizer, max_norm)


# Lightning's own collectives (a checkpoint's broadcast, barriers) and, under FSDP2,
# the step whose collectives run inside it fail for a lost process as core_ops DDP's
# allreduce does: the error names the rank that is gone.
_naming_lost_ranks_in(_ApexDDP, "apex-ddp", ("barrier", "broadcast", "reduce", "all_gather"))


class _ApexFabricDDP(_FabricClipping):
    """Fabric's DDPStrategy with core_ops' DistributedDataParallel (options as the
    Trainer's ApexDDPStrategy); ``fabric.no_backward_sync`` and
    ``fabric.clip_gradients`` work as with Lightning's own."""

    _no_sync = None  # the tree's _NoSync class, set by strategy_classes
    _core_ops_reads_ddp_settings = True

    def __init__(self, **options):
        self.apex_ddp, options = _split(options, "ApexDDPStrategy")
        super().__init__(**options)
        self._backward_sync_control = self._no_sync()

    @property
    def apex_ddp_options(self):
        return self.apex_ddp.as_kwargs()

    def setup_module(self, module):
        return DistributedDataParallel(module, **self.apex_ddp_options)

    @classmethod
    def register_strategies(cls, strategy_registry):
        _register_ddp(cls, strategy_registry, "core_ops' DistributedDataParallel")


class _FSDP:
    """What the Trainer's and Fabric's ``apex-fsdp`` share: Lightning's
    ModelParallelStrategy (FSDP2) over every process as one data-parallel mesh, the
    model sharded by the strategy as ``FSDPOptions`` says: each module of a class in
    ``auto_wrap_policy`` (a set of classes, e.g. ``{Block}``) is given to ``fully_shard``,
    then the root (the Trainer: the LightningModule's children holding params, and the
    LightningModule only if it holds params itself, as Lightning's own FSDP2 recipe
    shards ``self.model``), with ``reshard_after_forward``, ``cpu_offload`` (True or an FSDP2
    ``CPUOffloadPolicy``: shards, grads and the optimizer's step on the CPU) and, under
    ``precision="apex-O2"``, FSDP2's mixed precision for the opt level
    (``core_ops.amp.fsdp_policy``: params gathered in half, grads reduced in
    ``reduce_dtype``). A model already sharded (by
    ``configure_model``) is left as it is. Checkpoints are torch.distributed.checkpoint
    folders, or one full file with ``save_distributed_checkpoint=False``, as Lightning's."""

    strategy_name = "apex-fsdp"

    def _take_options(self, auto_wrap_policy, reshard_after_forward, reduce_dtype, cpu_offload, options):
        for name in ("data_parallel_size", "tensor_parallel_size"):
            if name in options:
                raise TypeError(f"ApexFSDPStrategy shards over all processes and takes no {name}; use "
                                "ModelParallelStrategy with precision='apex-O2' for tensor parallelism")
        try:
            self.apex_fsdp = FSDPOptions(auto_wrap_policy, reshard_after_forward, reduce_dtype, cpu_offload)
        except (TypeError, ValueError) as e:
            raise type(e)(f"ApexFSDPStrategy: {e}") from None

    def setup_environment(self):
        self._data_parallel_size, self._tensor_parallel_size = self.num_nodes * self.num_processes, 1
        super().setup_environment()
        from core_ops.parallel import lost_ranks
        lost_ranks.register()  # each rank's host and pid, to name a lost one

    def _shard(self, module, precision, root):
        loop = getattr(precision, "loop", None)
        level = (loop.opt_level, loop.half_dtype) if loop is not None else (None,)
        return self.apex_fsdp.shard(module, self.device_mesh["data_parallel"], *level, root=root)

    @classmethod
    def register_strategies(cls, strategy_registry):
        if "apex-fsdp" not in strategy_registry:
            strategy_registry.register("apex-fsdp", cls, description="FSDP2 with core_ops' opt levels")


class _ApexFSDP(_FSDP):
    """The Trainer's ``strategy="apex-fsdp"``: the model is sharded in ``configure_model``
    (the Trainer calls it after setting up the processes, before the precision casts).
    FSDP2's collectives run inside the step: a step that fails because a rank is gone
    names it (Note [Naming a lost rank]), as Lightning's collectives here do."""

    def __init__(self, auto_wrap_policy=None, reshard_after_forward=True, reduce_dtype=torch.float32,
                 cpu_offload=False, **options):
        self._take_options(auto_wrap_policy, reshard_after_forward, reduce_dtype, cpu_offload, options)
        super().__init__(**options)

    def setup_environment(self):
        super().setup_environment()
        module = self.lightning_module
        own = type(module).configure_model

        def configure_model():  # the Trainer calls it next: the model is sharded there
            own(module)
            # Not the LightningModule itself (unless it holds params): training_step may
            # call its children directly, never running its forward.
            self._shard(module, self.precision_plugin, root=False)

        module.configure_model = configure_model

    def teardown(self):
        module = self.lightning_module
        if module is not None:
            module.__dict__.pop("configure_model", None)
        super().teardown()


_naming_lost_ranks_in(_ApexFSDP, "apex-fsdp", ("training_step", "backward", "optimizer_step", "barrier",
                                              "broadcast"))


class _ApexFabricFSDP(_FabricClipping, _FSDP):
    """Fabric's ``strategy="apex-fsdp"``: ``fabric.setup_module(model)`` shards the model,
    then prepares it for the opt level (Fabric converts a module for its precision
    before its strategy sees it: under this strategy that waits for the shards, which
    are then the O2 masters); optimizers are made of the sharded params after it, as
    with Lightning's ModelParallelStrategy."""

    def __init__(self, auto_wrap_policy=None, reshard_after_forward=True, reduce_dtype=torch.float32,
                 cpu_offload=False, **options):
        self._take_options(auto_wrap_policy, reshard_after_forward, reduce_dtype, cpu_offload, options)
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
        self._shard(module, self.precision, root=True)  # Fabric calls the module's forward
        loop = getattr(self.precision, "loop", None)
        return module if loop is None else loop.prepare_model(module)


def _made(name, mixin, base, module_name, doc=None, **attrs):
    return type(name, (mixin, base), {"__module__": module_name, "__qualname__": name,
                                      "__doc__": doc or mixin.__doc__, **attrs})


def strategy_classes(trainer_pkg, fabric_pkg, module_name):
    """(Trainer ApexDDPStrategy, Fabric ApexDDPStrategy, CoreOpsSyncBatchNorm, Fabric's
    backward-sync control, Trainer ApexFSDPStrategy, Fabric ApexFSDPStrategy) of one
    tree, named in ``module_name`` (_trees.py moves the Fabric ones to their own module;
    picklable for ``apex-ddp_spawn``)."""
    sync_bn = _made("CoreOpsSyncBatchNorm", _SyncBatchNorm, trainer_pkg.plugins.LayerSync, module_name)
    no_sync = _made("_NoSync", _NoSync, fabric_pkg.strategies.strategy._BackwardSyncControl, module_name)
    ddp = _made("ApexDDPStrategy", _ApexDDP, trainer_pkg.strategies.DDPStrategy, module_name,
                _torch_sync_bn=trainer_pkg.plugins.TorchSyncBatchNorm, _our_sync_bn=sync_bn)
    fabric_ddp = _made("ApexDDPStrategy", _ApexFabricDDP, fabric_pkg.strategies.DDPStrategy, module_name,
                       _no_sync=no_sync)
    fsdp = _made("ApexFSDPStrategy", _ApexFSDP, trainer_pkg.strategies.ModelParallelStrategy, module_name,
                 doc=_FSDP.__doc__)
    fabric_fsdp = _made("ApexFSDPStrategy", _ApexFabricFSDP, fabric_pkg.strategies.ModelParallelStrategy,
                        module_name, doc=_FSDP.__doc__ + "\n\n" + _ApexFabricFSDP.__doc__)
    return ddp, fabric_ddp, sync_bn, no_sync, fsdp, fabric_fsdp
