"""DistributedDataParallel with Apex's arguments: flat buckets of gradients, each
allreduced asynchronously from the gradient hooks while backward still runs."""

import contextlib
import copy
import zlib

import torch
import torch.distributed as dist
from torch import nn

from ..amp import masters as amp_masters
from .._flat_collectives import flat_broadcast, flat_call
from . import ddp_state_dict, lost_ranks
from ._groups import all_gather_flat, comm_device, global_src, require_initialized
from .ddp_backward import GradAllreduce
from .ddp_checks import check_unowned, trainable
from .options import DDPOptions


def _check_module(module):
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if isinstance(module, (DistributedDataParallel, nn.parallel.DistributedDataParallel)):
        raise ValueError(f"module is already wrapped in {type(module).__name__}; wrap the "
                         "inner module once")
    return trainable(module)


def _group_timeout(group):
    """The timeout ``group`` was created with (new groups otherwise get torch's default
    of 30 minutes, not the one the user gave init_process_group); None if unknown."""
    try:
        group = group or dist.group.WORLD
        return group._get_backend(torch.device("cpu")).options._timeout
    except (AttributeError, RuntimeError):
        try:
            return group._get_backend(torch.device("cuda")).options._timeout
        except (AttributeError, RuntimeError):
            return None


def _layout_crc(tensors):
    return zlib.crc32(";".join(f"{tuple(t.shape)}:{t.dtype}" for t in tensors).encode())


def _signature(params, module):
    """What must agree across ranks: (count, elements, layout crc) of the params that
    are reduced, and a layout crc of everything broadcast from rank 0 (every param,
    frozen ones included, and every buffer), which must match to the byte."""
    state = list(module.parameters()) + list(module.buffers())
    return [len(params), sum(p.numel() for p in params), _layout_crc(params), _layout_crc(state)]


class DistributedDataParallel(nn.Module):
    """Apex's ``DistributedDataParallel(module, message_size=10_000_000,
    delay_allreduce=False, allreduce_trigger_params=None, retain_allreduce_buffers=False,
    allreduce_always_fp32=False, num_allreduce_streams=1, gradient_average=True,
    gradient_predivide_factor=1.0, process_group=None)``, plus ``broadcast_buffers`` and
    ``allreduce_dtype``.

    At construction every rank checks that the models agree (count, shapes and dtypes
    of params needing grad; a clear RuntimeError otherwise, or when a rank does not join
    within the process group's timeout), and params and buffers are broadcast from the
    group's rank 0. During backward each grad, once accumulated, is packed into a flat
    bucket of ``message_size`` elements (Note [Bucket layout] in buckets.py); a full
    bucket is allreduced asynchronously right away, so communication overlaps the rest
    of backward. The end of backward waits for the buckets and leaves averaged grads
    (``gradient_average``; sum / ``gradient_predivide_factor`` otherwise) in ``.grad``.
    The first backward observes the order in which grads become ready; rank 0's order
    fixes the buckets of every rank. ``delay_allreduce=True`` reduces everything after
    backward instead.

    Beyond Apex: ``no_sync()`` accumulates grads locally; params that get no grad on a
    rank are reduced as zeros (no hang), and keep ``grad=None`` when no rank used them;
    frozen params (requires_grad False) are left alone. fp16 / bf16 grads are reduced
    in their own dtype unless ``allreduce_always_fp32``; ``allreduce_dtype`` reduces
    every grad in the dtype given instead, e.g. ``torch.bfloat16`` for an fp32 model
    halves the bytes sent (torch's ``bf16_compress_hook``): each grad is rounded to
    bf16 (8 mantissa bits) as it is copied into its bucket, summed in bf16, and
    widened back into ``.grad``. Buffers are broadcast from
    rank 0 before each training forward when ``broadcast_buffers``.

    Grads are views of the flat buffers after the first step (torch's
    ``gradient_as_bucket_view``): with ``zero_grad(set_to_none=False)`` the next
    backward accumulates in place and nothing is copied (unless the buffer has another
    dtype than the grads: ``allreduce_always_fp32``, ``allreduce_dtype``). ``retain_allreduce_buffers``
    keeps the fp32 buffers of ``allreduce_always_fp32`` between steps (same-dtype
    buffers are always kept, the grads live there, and so are those of
    ``allreduce_dtype``, reused every step); ``allreduce_buffers`` lists them.
    ``num_allreduce_streams`` is accepted for Apex compatibility: the torch.distributed
    backend already runs collectives on its own streams / threads.

    Params unfrozen after wrapping are noticed at the next forward that records a
    graph (Apex's ``needs_refresh``, which may also be set by hand): the ranks check
    that they agree on the new set (one all-gather; a rank that did not change fails
    it after the group's timeout) and the buckets are planned anew. Params frozen
    later stay planned and cost nothing (no grad, no used flag), so freezing a model
    for a step, as GAN loops do with the discriminator, re-plans nothing. Apex's
    ``disable_allreduce()`` / ``enable_allreduce()`` switch the reduction off and on
    across backward passes (``no_sync()`` does it for a block). At construction the
    frozen params and buffers, broadcast from rank 0, must have the same shapes and
    dtypes on every rank too.

    State dicts carry no wrapper prefix: ``state_dict()`` has the keys of
    ``module.state_dict()`` (torch's DDP adds ``module.``), so a checkpoint loads into
    the bare model; ``load_state_dict`` accepts keys with or without ``module.``.

    Without ``process_group`` (or given ``torch.distributed.group.WORLD``) the wrapper
    reduces on a new group spanning the world: its bucket collectives, launched at times
    that depend on each rank's ready order, then cannot interleave with other
    collectives of the default group (SyncBatchNorm's in backward, the user's own). Any
    other ``process_group`` is used as given, since creating a group is collective over
    the whole world and cannot be done behind the user's back: it must then carry no
    other collectives during backward (give SyncBatchNorm, say, a group of its own), or
    a rank that holds back a bucket for an unused param reorders the collectives and
    gloo / NCCL fail or hang.

    A param whose gradient is accumulated twice in one backward (shared by segments of
    reentrant activation checkpointing) raises a RuntimeError, unless
    ``delay_allreduce=True``, which reduces it once, after backward. Sparse gradients
    (``nn.Embedding(sparse=True)``) and uninitialized lazy params are rejected.
    """

    def __init__(self, module, message_size=DDPOptions.message_size, delay_allreduce=DDPOptions.delay_allreduce,
                 allreduce_trigger_params=None, retain_allreduce_buffers=DDPOptions.retain_allreduce_buffers,
                 allreduce_always_fp32=DDPOptions.allreduce_always_fp32,
                 num_allreduce_streams=DDPOptions.num_allreduce_streams,
                 gradient_average=DDPOptions.gradient_average,
                 gradient_predivide_factor=DDPOptions.gradient_predivide_factor, process_group=None,
                 broadcast_buffers=DDPOptions.broadcast_buffers, allreduce_dtype=DDPOptions.allreduce_dtype):
        super().__init__()
        params = _check_module(module)
        options = DDPOptions(message_size, delay_allreduce, allreduce_always_fp32, allreduce_dtype,
                             num_allreduce_streams, gradient_average, gradient_predivide_factor,
                             retain_allreduce_buffers, broadcast_buffers)
        require_initialized("DistributedDataParallel")
        self.module = module
        for name, value in options.as_kwargs().items():  # Apex's attribute names
            setattr(self, name, value)
        self._join(process_group, params)
        self.needs_refresh = False  # Apex's flag: True re-plans the buckets at the next forward
        trigger_ids = None
        if allreduce_trigger_params is not None:
            trigger_ids = {id(p) for p in allreduce_trigger_params}
            if not trigger_ids <= {id(p) for p in params}:
                raise ValueError("allreduce_trigger_params must be parameters of module that "
                                 "require grad")
        self._broadcast_state()
        self._sync = True  # off inside no_sync() / after disable_allreduce()
        self._backward_syncs = True  # what the last forward decided for its backward
        # Everything tied to the params' objects or to one backward: a copy makes its own.
        self._grads = GradAllreduce(self, params, trigger_ids)
        ddp_state_dict.install(self)

    # --- construction ------------------------------------------------------------

    def _join(self, process_group, params):
        """The first collectives: check that the models agree, make the group."""
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self._agree("joined construction", params)
        lost_ranks.register()
        if process_group is None or process_group is dist.group.WORLD:
            # Every rank is here: creating the group cannot stall. The default group
            # given by name is the group SyncBatchNorm and user code share too, so it
            # gets a private twin as well (see the class docstring).
            self.process_group = dist.new_group(timeout=_group_timeout(None))

    def _agree(self, doing, params):
        """Checks that every rank's module and ``params`` (those to reduce) match rank
        0's (one all-gather). A rank that never arrives fails it after the group's
        timeout, with this message."""
        try:
            mine = torch.tensor(_signature(params, self.module), dtype=torch.int64,
                                device=comm_device(self.process_group, params[0].device))
            every = all_gather_flat(mine, self.process_group).tolist()
        except (RuntimeError, TimeoutError) as e:  # gloo / NCCL timeouts, closed peers
            raise RuntimeError(
                f"DistributedDataParallel: not every one of the {self.world_size} ranks of "
                f"the process group {doing} within the group's timeout (a rank died, never "
                "started, or does not have the same model and trainable params): "
                f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
        if any(sig[:3] != every[0][:3] for sig in every):
            lines = "; ".join(f"rank {r}: {n} params, {e} elements, layout crc {c:#x}"
                              for r, (n, e, c, _) in enumerate(every))
            raise RuntimeError("DistributedDataParallel: the module differs across ranks "
                               f"(params requiring grad, their shapes or dtypes): {lines}")
        if any(sig[3] != every[0][3] for sig in every):
            lines = "; ".join(f"rank {r}: crc {sig[3]:#x}" for r, sig in enumerate(every))
            raise RuntimeError("DistributedDataParallel: the module's frozen params or buffers "
                               "(shapes, dtypes) differ across ranks, so rank 0's cannot be "
                               f"broadcast to the others: {lines}")

    def _refresh_if_changed(self):
        """Apex's refresh: params that became trainable after the buckets were planned
        (or ``needs_refresh`` set by hand) make every rank agree on the new set (one
        all-gather; a rank whose set did not change waits elsewhere, and the others
        fail after the group's timeout, with a message saying so) and plan the buckets
        anew. Params frozen since stay in the plan: they produce no grad, so they cost
        nothing and a model whose params are frozen and unfrozen in turn (a GAN's
        discriminator) is planned once."""
        new = [p for p in self.module.parameters() if p.requires_grad and id(p) not in self._grads.index]
        if not new and not self.needs_refresh:
            return
        new = list(dict.fromkeys(new))
        check_unowned(new, owner=self)
        params = self._grads.params + new
        self._agree("re-planned its buckets (params unfrozen)", params)
        self._grads.adopt(params)
        self.needs_refresh = False

    def _broadcast_state(self):
        """Rank 0's params, buffers and amp O2 fp32 masters, on every rank (Note
        [Masters follow DDP's broadcast] in core_ops/amp/masters.py)."""
        with torch.no_grad():
            tensors = [t for t in list(self.module.parameters()) + list(self.module.buffers())]
            tensors += [m for _, m in amp_masters.named_in(self.module)]
            if tensors:
                flat_broadcast([t.data for t in tensors], self.process_group,
                                        global_src(self.process_group))

    def _sync_buffers(self):
        buffers = [b for b in self.module.buffers()]
        if buffers and self.world_size > 1:
            with torch.no_grad():
                flat_broadcast(buffers, self.process_group, global_src(self.process_group))

    # --- public --------------------------------------------------------------------

    def forward(self, *inputs, **kwargs):
        self._grads.start_clean()  # after a backward that failed midway
        if torch.is_grad_enabled():
            # As in torch's DDP, a forward that records a graph decides whether its
            # backward reduces: one inside no_sync() accumulates, even if its backward
            # runs after the block (a no_grad forward has no backward: it decides nothing).
            self._backward_syncs = self._sync
            self._refresh_if_changed()
        if self.broadcast_buffers and self.module.training and torch.is_grad_enabled():
            self._sync_buffers()
        output = self.module(*inputs, **kwargs)
        if torch.is_grad_enabled() and self._backward_syncs:
            self._grads.hook_outputs(output)
        return output

    @property
    def require_backward_grad_sync(self):
        """torch's DistributedDataParallel attribute: False inside ``no_sync()`` (and
        after ``disable_allreduce()``), when backward passes accumulate locally."""
        return self._sync

    @contextlib.contextmanager
    def no_sync(self):
        """Forward passes inside (and so their backward passes, wherever they run)
        accumulate grads locally with no communication; the backward of the first
        forward outside reduces the accumulated sum (gradient accumulation). As in
        torch's DDP, it is the forward that must be inside."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    def disable_allreduce(self):
        """Apex's: the backward passes of the forwards that follow accumulate grads
        locally until enable_allreduce() (no_sync() does the same for a block)."""
        self._sync = False

    def enable_allreduce(self):
        self._sync = True

    def __deepcopy__(self, memo):
        """A copy (an EMA model, a teacher) made without any collective: the module is
        copied, the process group shared (groups cannot be copied), and the copy's
        params get hooks of their own and buckets planned by the copy's first backward."""
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        memo[id(self.process_group)] = self.process_group
        state = {k: v for k, v in self.__dict__.items() if k != "_grads"}
        new.__dict__.update(copy.deepcopy(state, memo))
        new._grads = self._grads.copied(new, memo)
        return new

    @property
    def allreduce_buffers(self):
        """The flat buffers of the buckets (grads then used flags), in launch order."""
        return [b.buffer for b in self._grads.buckets or [] if b.buffer is not None]


def flat_dist_call(tensors, call, extra_args=None):
    """Apex's helper: ``call(flat, *extra_args)`` on each (device, dtype) group of
    ``tensors`` flattened into one buffer, the results copied back; after
    ``dist.all_reduce`` the values are divided by the world size (an average), as in
    Apex."""
    def run(flat):
        call(flat, *(extra_args or ()))
        if call is dist.all_reduce:
            flat /= dist.get_world_size()
    flat_call(tensors, run)
