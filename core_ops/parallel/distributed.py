"""DistributedDataParallel with Apex's arguments: flat buckets of gradients, each
allreduced asynchronously from the gradient hooks while backward still runs."""

import contextlib
import copy
import math
import weakref
import zlib

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from ..amp import masters as amp_masters
from .._flat_collectives import flat_broadcast, flat_call
from . import buckets as _buckets
from . import lost_ranks
from ._groups import all_gather_flat, comm_device, global_src, require_initialized
from .ddp_checks import OWNED, check_unowned, ready_twice_error, sparse_grad_error, trainable
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


# What a deep copy makes anew instead of copying: state tied to the original's param
# objects (hooks, buckets whose buffers its grads view) or to one backward.
_MADE_PER_COPY = frozenset({"_params", "_index", "_hooked", "_trigger_ids", "_buckets", "_slot",
                            "_seen", "_next", "_works", "_used", "_callback_queued",
                            "_output_queued"})


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
        self._params = params
        self._join(process_group)
        self.needs_refresh = False  # Apex's flag: True re-plans the buckets at the next forward
        self._trigger_ids = None
        if allreduce_trigger_params is not None:
            self._trigger_ids = {id(p) for p in allreduce_trigger_params}
            if not self._trigger_ids <= {id(p) for p in params}:
                raise ValueError("allreduce_trigger_params must be parameters of module that "
                                 "require grad")
        self._broadcast_state()
        self._sync = True  # off inside no_sync() / after disable_allreduce()
        self._backward_syncs = True  # what the last forward decided for its backward
        self._hooked = WeakIdKeyDictionary()  # params with our hook: one hook each, ever
        self._finish_generation = 0  # of the finish queued last (Note [End of backward])
        self._adopt(params)
        self._register_state_dict_hook(_strip_prefix)
        self._register_load_state_dict_pre_hook(_add_prefix, with_module=True)
        self.register_load_state_dict_post_hook(_unprefixed_report)

    # --- construction ------------------------------------------------------------

    def _comm_device(self):
        return comm_device(self.process_group, self._params[0].device)

    def _join(self, process_group):
        """The first collectives: check that the models agree, make the group."""
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self._agree("joined construction")
        lost_ranks.register()
        if process_group is None or process_group is dist.group.WORLD:
            # Every rank is here: creating the group cannot stall. The default group
            # given by name is the group SyncBatchNorm and user code share too, so it
            # gets a private twin as well (see the class docstring).
            self.process_group = dist.new_group(timeout=_group_timeout(None))

    def _wait(self, work):
        """``work.wait()``; a collective that fails for a lost process says which rank is
        gone (Note [Naming a lost rank]) and how to go on."""
        try:
            work.wait()
        except (RuntimeError, TimeoutError) as e:
            raise RuntimeError(
                f"DistributedDataParallel: the gradient allreduce failed on rank {dist.get_rank()} of "
                f"{self.world_size}: {lost_ranks.diagnosis()}. Restart the run from its last checkpoint "
                "(torchrun --max-restarts, core_ops.checkpoints.latest_everywhere). The backend said: "
                f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e

    def _agree(self, doing, params=None):
        """Checks that every rank's module and ``params`` (default: those reduced now)
        match rank 0's (one all-gather). A rank that never arrives fails it after the
        group's timeout, with this message."""
        try:
            mine = torch.tensor(_signature(params or self._params, self.module), dtype=torch.int64,
                                device=self._comm_device())
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

    def _adopt(self, params):
        """Makes ``params`` the ones reduced, with hooks on each (once) and buckets to be
        planned by the next backward (Note [Bucket layout])."""
        self._params = params
        self._index = {id(p): i for i, p in enumerate(params)}
        for p in params:
            OWNED[p] = weakref.ref(self)
            if p not in self._hooked:
                self._hooked[p] = True
                p.register_post_accumulate_grad_hook(self._make_hook())
        self._buckets = None
        self._slot = {}
        if self.delay_allreduce:  # no overlap to gain: a fixed layout, the same on every rank
            self._build_buckets(list(reversed(range(len(params)))))
        self._reset_iteration()

    def _refresh_if_changed(self):
        """Apex's refresh: params that became trainable after the buckets were planned
        (or ``needs_refresh`` set by hand) make every rank agree on the new set (one
        all-gather; a rank whose set did not change waits elsewhere, and the others
        fail after the group's timeout, with a message saying so) and plan the buckets
        anew. Params frozen since stay in the plan: they produce no grad, so they cost
        nothing and a model whose params are frozen and unfrozen in turn (a GAN's
        discriminator) is planned once."""
        new = [p for p in self.module.parameters() if p.requires_grad and id(p) not in self._index]
        if not new and not self.needs_refresh:
            return
        new = list(dict.fromkeys(new))
        check_unowned(new, owner=self)
        params = self._params + new
        self._agree("re-planned its buckets (params unfrozen)", params)
        self._adopt(params)
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

    def _build_buckets(self, order):
        groups = _buckets.plan(self._params, order, self.message_size, self._trigger_ids,
                               self._buffer_dtype)
        self._buckets = [_buckets.Bucket([self._params[i] for i in g],
                                         self._buffer_dtype(self._params[g[0]]))
                         for g in groups]
        self._slot = {i: (b, s) for b, g in enumerate(groups) for s, i in enumerate(g)}
        for bucket in self._buckets:
            bucket.pre_scale, bucket.post_scale = self._scales(bucket.dtype, bucket.params[0].dtype)

    def _buffer_dtype(self, param):
        return _buckets.buffer_dtype(param, self.allreduce_always_fp32, self.allreduce_dtype)

    def _scales(self, dtype, grad_dtype):
        """Note [Averaging]: Apex divides by gradient_predivide_factor before the sum
        and by world_size / factor after it. When both factors are powers of two and
        the dtype has float32's exponent range, scaling commutes exactly with the sum,
        so all of it is done before, fused into the copy of each grad into its bucket,
        which saves a pass over the gradients after communication (torch's DDP fuses
        its division the same way). float16 grads keep Apex's order: pre-dividing their
        small values would flush them to zero. Wider grads sent as float16
        (allreduce_dtype) are divided first, as torch's fp16_compress_hook does: a sum
        of values that each fit in float16 can overflow it."""
        pre = 1.0 / self.gradient_predivide_factor
        post = self.gradient_predivide_factor / self.world_size if self.gradient_average else 1.0
        exact = all(math.frexp(v)[0] == 0.5 for v in (pre, post))
        compressed = dtype == torch.float16 and grad_dtype != torch.float16
        if exact and (dtype in (torch.float32, torch.float64, torch.bfloat16) or compressed):
            return pre * post, 1.0
        return pre, post

    def _agreed_order(self):
        """Rank 0's ready order from this first backward, the same on every rank.
        Params rank 0 did not see come last, in reverse registration order."""
        seen = list(self._seen)
        rest = [i for i in reversed(range(len(self._params))) if i not in self._seen]
        order = torch.tensor(seen + rest, dtype=torch.int64, device=self._comm_device())
        dist.broadcast(order, global_src(self.process_group), group=self.process_group)
        return order.tolist()

    def _name(self, param):
        """``param``'s name in the module, for error messages."""
        return next((n for n, p in self.module.named_parameters() if p is param), "<unnamed>")

    # --- one backward ------------------------------------------------------------

    # Note [End of backward]: a callback queued on the autograd graph task finishes the
    # buckets (launches the rest, waits, writes the grads back) once that task is over.
    # It must be queued on the outermost task: reentrant activation checkpointing runs
    # a nested backward per checkpointed segment, and a callback queued by a grad hook
    # firing in one of those would run when that segment ends, reduce every bucket
    # before the other grads exist, and then reduce them all again. So forward hooks
    # each of its output tensors made by autograd ops (_hook_outputs); the first of these
    # hooks to fire in a backward, at its start, in the outer task, before any
    # checkpoint node below the outputs, queues the callback. A loss not computed from
    # the outputs fires none of them: the first grad hook queues it then. When both
    # happen in one backward (a loss that also reads params directly), the callback of
    # the output hook makes the earlier one stale: one finish per backward. A backward
    # that readies no grad (torch.autograd.grad(out, inputs), a gradient penalty)
    # finishes nothing.

    def _reset_iteration(self):
        self._callback_queued = False  # a finish is queued (Note [End of backward])
        self._output_queued = False  # ... by an output hook
        self._seen = {}  # the indices of the params readied in this backward, in order
        self._next = 0
        self._works = []
        self._used = []

    def _queue_finish(self):
        """Queues the end of backward on the running graph task; a finish queued before
        and not run yet becomes stale (Note [End of backward])."""
        self._finish_generation += 1
        generation = self._finish_generation
        ref = weakref.ref(self)

        def finish():
            owner = ref()
            if owner is not None and owner._finish_generation == generation:
                owner._finish_backward()
        self._callback_queued = True
        torch.autograd.Variable._execution_engine.queue_callback(finish)

    def _hook_outputs(self, output):
        """Hooks every tensor of ``output`` (nested in tuples, lists, dicts) made by an
        op that requires grad, to queue the end of backward from the outer graph task
        (Note [End of backward]). Hooks, not an autograd Function: the outputs stay the
        module's own tensors, which may still be modified in place. Leaves (an input or
        param returned as is) are skipped: a hook on one would outlive this step."""
        ref = weakref.ref(self)

        def hook(grad):
            owner = ref()
            if owner is not None and not owner._output_queued:
                owner._output_queued = True
                owner._queue_finish()
        for t in tree_leaves(output):
            if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                t.register_hook(hook)

    def _make_hook(self):
        ref = weakref.ref(self)

        def hook(param):
            owner = ref()
            if owner is not None:
                owner._grad_ready(param)
        return hook

    def _grad_ready(self, param):
        index = self._index.get(id(param))
        if not self._backward_syncs or index is None:  # None: frozen when the buckets were planned
            return
        if param.grad is not None and param.grad.layout != torch.strided:
            raise sparse_grad_error(self._name(param), param.grad)
        if index in self._seen and not self.delay_allreduce:
            self._ready_again(param, index)
            return
        self._seen[index] = None
        if not self._callback_queued:  # no output hook fired: Note [End of backward]
            self._queue_finish()
        if self._buckets is None or self.delay_allreduce:
            # Copied into the buckets at the end: the first backward only records the
            # order, and with delay_allreduce a grad may still grow (reentrant checkpoints).
            return
        b, slot = self._slot[index]
        bucket = self._buckets[b]
        bucket.put(slot, param.grad)
        if bucket.pending == 0:
            self._launch_ready()

    def _ready_again(self, param, index):
        """A grad that grew after it was ready in this backward: a param shared by
        segments of reentrant activation checkpointing, each segment's backward adding
        its part. Its bucket takes the sum while it is not on the wire; after that what
        was added would be lost, so that raises."""
        if self._buckets is None:  # the first backward copies every grad at its end
            return
        b, slot = self._slot[index]
        if b < self._next:
            self._drain()
            raise ready_twice_error(self._name(param))
        self._buckets[b].put_again(slot, param.grad)

    def _drain(self):
        """Waits for the allreduces launched in this backward before it fails: left
        unwaited, torch 2.7's gloo group never completed them and its destructor
        waited on them forever, hanging the rank's exit."""
        for work in self._works:
            work.wait()

    def _launch_ready(self):
        """Launches complete buckets in layout order: every rank issues the same
        collectives in the same order even when grads arrive in another order."""
        while self._next < len(self._buckets) and self._buckets[self._next].pending == 0:
            self._launch(self._buckets[self._next])
            self._next += 1

    def _launch(self, bucket):
        self._used.append(bucket.fill_missing())
        self._works.append(dist.all_reduce(bucket.buffer, group=self.process_group, async_op=True))

    def _finish_backward(self):
        if not self._seen:  # no grad readied: nothing to reduce (Note [End of backward])
            self._reset_iteration()
            return
        try:
            filled_late = self._buckets is None or self.delay_allreduce  # see _grad_ready
            if self._buckets is None:
                self._build_buckets(self._agreed_order())
            if filled_late:
                for i in self._seen:
                    b, slot = self._slot[i]
                    self._buckets[b].put(slot, self._params[i].grad)
            for bucket in self._buckets[self._next:]:
                self._launch(bucket)
            for bucket, work, used in zip(self._buckets, self._works, self._used):
                self._wait(work)
                if bucket.post_scale != 1.0:
                    bucket.buffer.mul_(bucket.post_scale)
                bucket.write_back(used)
                if self.allreduce_always_fp32 and not self.retain_allreduce_buffers:
                    bucket.release()  # Apex's: the fp32 copies of half grads go
        finally:
            self._reset_iteration()
            for bucket in self._buckets or []:  # after a failure too: no stale ready slots
                bucket.reset()

    # --- public --------------------------------------------------------------------

    def forward(self, *inputs, **kwargs):
        if self._callback_queued:  # an earlier backward failed midway: start clean
            self._reset_iteration()
            if self._buckets is not None:
                for bucket in self._buckets:
                    bucket.reset()
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
            self._hook_outputs(output)
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
        state = {k: v for k, v in self.__dict__.items() if k not in _MADE_PER_COPY}
        new.__dict__.update(copy.deepcopy(state, memo))
        params = [copy.deepcopy(p, memo) for p in self._params]  # the module's copies, via memo
        new._hooked = WeakIdKeyDictionary()
        new._trigger_ids = None
        if self._trigger_ids is not None:
            new._trigger_ids = {id(c) for p, c in zip(self._params, params)
                                if id(p) in self._trigger_ids}
        new._adopt(params)
        return new

    @property
    def allreduce_buffers(self):
        """The flat buffers of the buckets (grads then used flags), in launch order."""
        return [b.buffer for b in self._buckets or [] if b.buffer is not None]


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


def _dotted(meta_key):
    """A state-dict metadata key ("a.b", "" for the root) as a key prefix ("a.b.", "")."""
    return meta_key + "." if meta_key else ""


def _undotted(key_prefix):
    return key_prefix[:-1] if key_prefix else ""


def _strip_prefix(module, state_dict, prefix, local_metadata):
    """state_dict hook: ``<prefix>module.x`` -> ``<prefix>x`` (no wrapper prefix)."""
    inner = prefix + "module."
    for key in [k for k in state_dict if k.startswith(inner)]:
        state_dict[prefix + key[len(inner):]] = state_dict.pop(key)
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:
        for key in [k for k in metadata if _dotted(k).startswith(inner)]:
            metadata[_undotted(prefix + _dotted(key)[len(inner):])] = metadata.pop(key)
    return state_dict


def _add_prefix(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                error_msgs):
    """load_state_dict pre-hook: a bare model's keys (ours) get the ``module.`` prefix,
    a wrapped model's (torch's DDP) keep theirs. Which one a state dict is, is decided
    by which reading names more of the wrapped module's keys, not by the prefix alone:
    the wrapped model may have a child called ``module`` of its own."""
    inner = prefix + "module."
    keys = [k for k in state_dict if k.startswith(prefix)]
    expected = set(module.module.state_dict().keys())
    bare_hits = sum(k[len(prefix):] in expected for k in keys)
    wrapped_hits = sum(k.startswith(inner) and k[len(inner):] in expected for k in keys)
    if wrapped_hits > bare_hits:
        return
    for key in keys:
        state_dict[inner + key[len(prefix):]] = state_dict.pop(key)
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:  # read all before writing: "module" may be a child's name
        metadata.update({_undotted(inner + _dotted(key)[len(prefix):]): metadata[key]
                         for key in metadata if _dotted(key).startswith(prefix)})


def _unprefixed_report(module, incompatible_keys):
    """load_state_dict post-hook: missing and unexpected keys are reported as the user's
    state dict spells them, without the wrapper's ``module.``."""
    for keys in (incompatible_keys.missing_keys, incompatible_keys.unexpected_keys):
        keys[:] = [k[len("module."):] if k.startswith("module.") else k for k in keys]
