"""What DistributedDataParallel does during backward: the grad hooks on the params it
reduces, the buckets they fill, the allreduces launched as buckets fill, and the end of
backward that waits for them and writes the grads back.

``GradAllreduce`` holds all of it, and nothing else: everything tied to the params'
objects (their hooks, buckets whose buffers their grads view) or to one backward. A
copy of the wrapper (an EMA model) makes a new one for its own params (``copied``) and
copies the rest of the wrapper as is.
"""

import copy
import math
import weakref

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from . import buckets as _buckets
from . import lost_ranks
from ._groups import comm_device, global_src
from .ddp_checks import OWNED, ready_twice_error, sparse_grad_error


class GradAllreduce:
    """The grads of ``params`` (the wrapper's params that require grad), reduced
    across the wrapper's process group with the wrapper's options, read from it when
    used (Apex's attributes: ``model.delay_allreduce`` may be set after wrapping).
    ``trigger_ids``: the ids of Apex's ``allreduce_trigger_params``, or None."""

    def __init__(self, wrapper, params, trigger_ids=None):
        self._wrapper = weakref.ref(wrapper)  # the wrapper owns this; no cycle
        self.trigger_ids = trigger_ids
        self._hooked = WeakIdKeyDictionary()  # params with our hook: one hook each, ever
        self._finish_generation = 0  # of the finish queued last (Note [End of backward])
        self.adopt(params)

    @property
    def wrapper(self):
        return self._wrapper()

    def copied(self, wrapper, memo):
        """The same for ``wrapper``, a deep copy of this one's wrapper made with
        ``memo``: its params are the copies of ours, with hooks of their own, and its
        buckets are planned by its first backward."""
        params = [copy.deepcopy(p, memo) for p in self.params]  # the module's copies, via memo
        trigger_ids = None
        if self.trigger_ids is not None:
            trigger_ids = {id(c) for p, c in zip(self.params, params) if id(p) in self.trigger_ids}
        return GradAllreduce(wrapper, params, trigger_ids)

    def adopt(self, params):
        """Makes ``params`` the ones reduced, with hooks on each (once) and buckets to be
        planned by the next backward (Note [Bucket layout])."""
        self.params = params
        self.index = {id(p): i for i, p in enumerate(params)}
        for p in params:
            OWNED[p] = self._wrapper
            if p not in self._hooked:
                self._hooked[p] = True
                p.register_post_accumulate_grad_hook(self._make_hook())
        self.buckets = None
        self._slot = {}
        if self.wrapper.delay_allreduce:  # no overlap to gain: a fixed layout, the same on every rank
            self._build_buckets(list(reversed(range(len(params)))))
        self.reset_iteration()

    # --- buckets -------------------------------------------------------------------

    def _build_buckets(self, order):
        ddp = self.wrapper
        groups = _buckets.plan(self.params, order, ddp.message_size, self.trigger_ids, self._buffer_dtype)
        self.buckets = [_buckets.Bucket([self.params[i] for i in g], self._buffer_dtype(self.params[g[0]]))
                        for g in groups]
        self._slot = {i: (b, s) for b, g in enumerate(groups) for s, i in enumerate(g)}
        for bucket in self.buckets:
            bucket.pre_scale, bucket.post_scale = self._scales(bucket.dtype, bucket.params[0].dtype)

    def _buffer_dtype(self, param):
        ddp = self.wrapper
        return _buckets.buffer_dtype(param, ddp.allreduce_always_fp32, ddp.allreduce_dtype)

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
        ddp = self.wrapper
        pre = 1.0 / ddp.gradient_predivide_factor
        post = ddp.gradient_predivide_factor / ddp.world_size if ddp.gradient_average else 1.0
        exact = all(math.frexp(v)[0] == 0.5 for v in (pre, post))
        compressed = dtype == torch.float16 and grad_dtype != torch.float16
        if exact and (dtype in (torch.float32, torch.float64, torch.bfloat16) or compressed):
            return pre * post, 1.0
        return pre, post

    def _agreed_order(self):
        """Rank 0's ready order from this first backward, the same on every rank.
        Params rank 0 did not see come last, in reverse registration order."""
        group = self.wrapper.process_group
        seen = list(self._seen)
        rest = [i for i in reversed(range(len(self.params))) if i not in self._seen]
        order = torch.tensor(seen + rest, dtype=torch.int64, device=comm_device(group, self.params[0].device))
        dist.broadcast(order, global_src(group), group=group)
        return order.tolist()

    def _name(self, param):
        """``param``'s name in the module, for error messages."""
        return next((n for n, p in self.wrapper.module.named_parameters() if p is param), "<unnamed>")

    # --- one backward ----------------------------------------------------------------

    # Note [End of backward]: a callback queued on the autograd graph task finishes the
    # buckets (launches the rest, waits, writes the grads back) once that task is over.
    # It must be queued on the outermost task: reentrant activation checkpointing runs
    # a nested backward per checkpointed segment, and a callback queued by a grad hook
    # firing in one of those would run when that segment ends, reduce every bucket
    # before the other grads exist, and then reduce them all again. So forward hooks
    # each of its output tensors made by autograd ops (hook_outputs); the first of these
    # hooks to fire in a backward, at its start, in the outer task, before any
    # checkpoint node below the outputs, queues the callback. A loss not computed from
    # the outputs fires none of them: the first grad hook queues it then. When both
    # happen in one backward (a loss that also reads params directly), the callback of
    # the output hook makes the earlier one stale: one finish per backward. A backward
    # that readies no grad (torch.autograd.grad(out, inputs), a gradient penalty)
    # finishes nothing.

    def reset_iteration(self):
        self.queued = False  # a finish is queued (Note [End of backward])
        self._output_queued = False  # ... by an output hook
        self._seen = {}  # the indices of the params readied in this backward, in order
        self._next = 0
        self._works = []
        self._used = []

    def start_clean(self):
        """Before a forward: a backward that failed midway left its state behind."""
        if self.queued:
            self.reset_iteration()
            for bucket in self.buckets or []:
                bucket.reset()

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
        self.queued = True
        torch.autograd.Variable._execution_engine.queue_callback(finish)

    def hook_outputs(self, output):
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
        index = self.index.get(id(param))
        ddp = self.wrapper
        if ddp is None or not ddp._backward_syncs or index is None:  # None: frozen when planned
            return
        if param.grad is not None and param.grad.layout != torch.strided:
            raise sparse_grad_error(self._name(param), param.grad)
        if index in self._seen and not ddp.delay_allreduce:
            self._ready_again(param, index)
            return
        self._seen[index] = None
        if not self.queued:  # no output hook fired: Note [End of backward]
            self._queue_finish()
        if self.buckets is None or ddp.delay_allreduce:
            # Copied into the buckets at the end: the first backward only records the
            # order, and with delay_allreduce a grad may still grow (reentrant checkpoints).
            return
        b, slot = self._slot[index]
        bucket = self.buckets[b]
        bucket.put(slot, param.grad)
        if bucket.pending == 0:
            self._launch_ready()

    def _ready_again(self, param, index):
        """A grad that grew after it was ready in this backward: a param shared by
        segments of reentrant activation checkpointing, each segment's backward adding
        its part. Its bucket takes the sum while it is not on the wire; after that what
        was added would be lost, so that raises."""
        if self.buckets is None:  # the first backward copies every grad at its end
            return
        b, slot = self._slot[index]
        if b < self._next:
            self._drain()
            raise ready_twice_error(self._name(param))
        self.buckets[b].put_again(slot, param.grad)

    def _drain(self):
        """Waits for the allreduces launched in this backward before it fails: left
        unwaited, torch 2.7's gloo group never completed them and its destructor
        waited on them forever, hanging the rank's exit."""
        for work in self._works:
            work.wait()

    def _launch_ready(self):
        """Launches complete buckets in layout order: every rank issues the same
        collectives in the same order even when grads arrive in another order."""
        while self._next < len(self.buckets) and self.buckets[self._next].pending == 0:
            self._launch(self.buckets[self._next])
            self._next += 1

    def _launch(self, bucket):
        self._used.append(bucket.fill_missing())
        self._works.append(dist.all_reduce(bucket.buffer, group=self.wrapper.process_group, async_op=True))

    def _wait(self, work):
        """``work.wait()``; a collective that fails for a lost process says which rank is
        gone (Note [Naming a lost rank]) and how to go on."""
        try:
            work.wait()
        except (RuntimeError, TimeoutError) as e:
            raise RuntimeError(
                f"DistributedDataParallel: the gradient allreduce failed on rank {dist.get_rank()} of "
                f"{self.wrapper.world_size}: {lost_ranks.diagnosis()}. Restart the run from its last checkpoint "
                "(torchrun --max-restarts, core_ops.checkpoints.latest_everywhere). The backend said: "
                f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e

    def _finish_backward(self):
        if not self._seen:  # no grad readied: nothing to reduce (Note [End of backward])
            self.reset_iteration()
            return
        ddp = self.wrapper
        try:
            filled_late = self.buckets is None or ddp.delay_allreduce  # see _grad_ready
            if self.buckets is None:
                self._build_buckets(self._agreed_order())
            if filled_late:
                for i in self._seen:
                    b, slot = self._slot[i]
                    self.buckets[b].put(slot, self.params[i].grad)
            for bucket in self.buckets[self._next:]:
                self._launch(bucket)
            for bucket, work, used in zip(self.buckets, self._works, self._used):
                self._wait(work)
                if bucket.post_scale != 1.0:
                    bucket.buffer.mul_(bucket.post_scale)
                bucket.write_back(used)
                if ddp.allreduce_always_fp32 and not ddp.retain_allreduce_buffers:
                    bucket.release()  # Apex's: the fp32 copies of half grads go
        finally:
            self.reset_iteration()
            for bucket in self.buckets or []:  # after a failure too: no stale ready slots
                bucket.reset()
