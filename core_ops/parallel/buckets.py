"""Flat gradient buckets: which params share one allreduce, and their flat buffers.

Note [Bucket layout]: a bucket holds params of one (device, param dtype, buffer dtype) in the
order their gradients became ready on rank 0 in the first iteration, so that every
rank fills and launches the same buckets in the same order (collectives must match
across ranks). Each buffer is the grads, back to back, followed by one "used" flag
per param: 1 when the grad was produced on this rank, 0 when the param took no part
in this backward (its slot is zeros). After the sum, a flag of 0 means no rank used
the param, and its grad stays None, as in torch's DistributedDataParallel.
"""

import torch

from ..multi_tensor_apply.ops import multi_tensor_scale


def buffer_dtype(param, always_fp32=False, reduce_dtype=None):
    """Grads are reduced in their own dtype, unless ``reduce_dtype`` names one for all
    of them (compression: fp32 grads sent as bf16 halve the bytes), or ``always_fp32``
    widens half ones (Apex's allreduce_always_fp32)."""
    if reduce_dtype is not None:
        return reduce_dtype
    if always_fp32 and param.dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    return param.dtype


def plan(params, order, message_size, trigger_ids=None, dtype_of=buffer_dtype):
    """Buckets as lists of param indices, in launch order. ``order`` is the ready order
    (indices into ``params``). A bucket closes when it reaches ``message_size``
    elements, or, with ``trigger_ids`` (Apex's allreduce_trigger_params), right after
    any trigger param. Buckets launch in the order they close: the order they complete."""
    open_, closed = {}, []
    for i in order:
        p = params[i]
        key = (p.device, p.dtype, dtype_of(p))  # one param dtype per bucket: see is_view
        members, numel = open_.get(key, ([], 0))
        members.append(i)
        open_[key] = (members, numel + p.numel())
        if trigger_ids is not None:
            if id(p) in trigger_ids:
                closed += [m for m, _ in open_.values()]
                open_.clear()
        elif open_[key][1] >= message_size:
            closed.append(members)
            del open_[key]
    # Whatever is still open closes at the end, ordered by when its last param came.
    position = {i: k for k, i in enumerate(order)}
    closed += sorted((m for m, _ in open_.values()), key=lambda m: position[m[-1]])
    return closed


class Bucket:
    """One flat buffer and the params whose grads it carries (Note [Bucket layout])."""

    def __init__(self, params, dtype):
        self.params = params
        self.numels = [p.numel() for p in params]
        self.offsets = [sum(self.numels[:k]) for k in range(len(params))]
        self.numel = sum(self.numels)
        self.dtype = dtype
        self.device = params[0].device
        self.is_view = self.dtype == params[0].dtype  # grads can live in the buffer itself
        self.buffer = None
        self.pre_scale = self.post_scale = 1.0  # set by the owner (Note [Averaging])
        self._scale_tensor = self._unread_flag = None  # pre_scale on the device, made on first use
        self.ready = [False] * len(params)
        self.pending = len(params)
        self.unscaled = []  # slots whose grad is the buffer's view: pre_scale at send()

    def allocate(self):
        # empty, not zeros: put() and fill_missing() write every slot and flag before
        # the buffer is reduced.
        if self.buffer is not None and self.pending == len(self.params) and self._held_elsewhere():
            self.buffer = None  # the first put of a backward: leave the old memory to its holders
        if self.buffer is None:
            self.buffer = torch.empty(self.numel + len(self.params), dtype=self.dtype,
                                      device=self.device)

    def _held_elsewhere(self):
        """Whether tensors other than the params' grads still use the buffer: grads a
        user kept from the last step before zero_grad(set_to_none=True), say. The
        buffer is then left to them and a new one made, so the next backward does not
        overwrite what they read (torch's DDP copies grads out of its buckets by
        default). Grads zeroed in place, still the params' grads, reuse the buffer."""
        if not self.is_view:
            return False
        use_count = getattr(torch._C, "_storage_Use_Count", None)
        if use_count is None:  # a torch without it: reuse, as before
            return False
        # + 2: self.buffer, and the storage object made to ask
        users = use_count(self.buffer.untyped_storage()._cdata) - 2
        if users <= 0 or users > len(self.params):  # nothing else; or more than the grads
            return users > 0
        attached = sum(1 for p in self.params if p.grad is not None and p.grad._base is self.buffer)
        return users > attached

    def release(self):
        """Frees the buffer when grads are not views of it (fp32 buffers of half grads)."""
        if not self.is_view:
            self.buffer = None

    def reset(self):
        self.ready = [False] * len(self.params)
        self.pending = len(self.params)
        self.unscaled = []

    def view(self, slot):
        start = self.offsets[slot]
        return self.buffer[start:start + self.numels[slot]].view_as(self.params[slot])

    def put(self, slot, grad):
        """Marks ``slot`` ready; copies ``grad`` in, times ``pre_scale``. A grad that
        is the buffer's view is scaled when the bucket is sent (``fill_missing``): until
        then it may still grow (``put_again``). Once per backward."""
        if self.ready[slot]:
            raise RuntimeError(f"Bucket.put: slot {slot} is already ready in this backward")
        self.allocate()
        view = self.view(slot)
        if grad is None:
            view.zero_()
        elif _is_view(view, grad):
            if self.pre_scale != 1.0:
                self.unscaled.append(slot)
        else:
            self._copy_in(view, grad)
        self.ready[slot] = True
        self.pending -= 1

    def put_again(self, slot, grad):
        """Takes the new value of a grad that grew after ``put`` in the same backward
        (before the bucket is sent): a view holds it already, a copy is made again."""
        view = self.view(slot)
        if not _is_view(view, grad):
            self._copy_in(view, grad)

    def _copy_in(self, view, grad):
        """``view`` = ``grad`` times ``pre_scale``, in one pass."""
        if (self.pre_scale != 1.0 and grad.dtype != view.dtype and grad.is_contiguous()
                and torch.float64 not in (grad.dtype, view.dtype)):
            # Scaled and rounded while copied, in one vectorized pass: torch.mul(out=)
            # into another dtype takes a scalar casting loop, 7x slower than a copy.
            # The scale and flag tensors are made once per bucket (the flag is unread).
            if self._scale_tensor is None:
                self._scale_tensor = torch.full((1,), self.pre_scale, device=self.device)
                self._unread_flag = torch.zeros(1, device=self.device)
            multi_tensor_scale([grad], [view], self._scale_tensor, self._unread_flag)
        elif self.pre_scale != 1.0:
            torch.mul(grad, self.pre_scale, out=view)  # scaled while copied: one pass
        else:
            view.copy_(grad)

    def fill_missing(self):
        """Readies the bucket to be sent: fills the slots this backward did not, with
        the param's grad when it has one (accumulated under no_sync, or zeroed in
        place), else zeros; scales the grads that are views (``put``); writes the used
        flags."""
        self.allocate()
        used = [ready or p.grad is not None for ready, p in zip(self.ready, self.params)]
        for slot, ready in enumerate(self.ready):
            if not ready:
                self.put(slot, self.params[slot].grad)
        for slot in self.unscaled:
            self.view(slot).mul_(self.pre_scale)
        self.unscaled = []
        self.buffer[self.numel:].copy_(torch.tensor(used, dtype=self.dtype))
        self.ready = [True] * len(self.params)
        self.pending = 0
        return used

    def write_back(self, used_here):
        """Gives each param its reduced grad. ``used_here`` are the slots this rank
        produced; for the others the sum of the flags says whether any rank did."""
        unused = [s for s, u in enumerate(used_here) if not u]
        used_anywhere = set(unused)
        if unused:  # one host read, only on a rank that skipped some params
            flags = self.buffer[self.numel:].tolist()
            used_anywhere = {s for s in unused if flags[s] != 0}
        for slot, p in enumerate(self.params):
            if not used_here[slot] and slot not in used_anywhere:
                p.grad = None
                continue
            view = self.view(slot)
            if self.is_view:
                if p.grad is None or p.grad.data_ptr() != view.data_ptr():
                    p.grad = view
            elif p.grad is None:
                p.grad = view.to(p.dtype)
            else:
                p.grad.copy_(view)


def _is_view(view, grad):
    """Whether ``grad`` is ``view`` itself: a grad that lives in its bucket."""
    return grad.data_ptr() == view.data_ptr() and grad.stride() == view.stride()
