"""Which tensors of one call may share memory: Note [Aliasing] in
csrc/include/core_ops/aliasing.h, worded the same for the reference and fake kernels.

A tensor an op writes shares memory with no other tensor of the call, except that
``out[i]`` may be its in-place partner ``in[i]`` itself; tensors only read may share
freely; only dense tensors are compared, and a written tensor with a stride of 0 is
refused. Real tensors are placed by address; fake and meta tensors (torch.compile's
tracing, shape inference) have none, and are placed within their storage, which views
share.
"""

import bisect

import torch

from ._validate import dense


def _place(t):
    """``(memory, begin, end)``: which memory ``t`` lies in, and its bytes there."""
    size = t.numel() * t.element_size()
    if t.device.type == "meta" or isinstance(t, torch._subclasses.FakeTensor):
        begin = t.storage_offset() * t.element_size()
        return ("storage", t.untyped_storage()._cdata), begin, begin + size
    return ("address", t.device.type), t.data_ptr(), t.data_ptr() + size


def _label(name, index):
    return name if index is None else f"{name}[{index}]"


def _spans(named, written):
    """(memory, begin, end, name, index, partner, tensor) of each dense non-empty tensor."""
    out = []
    for name, value, partner in named:
        if value is None:
            continue
        items = [(None, value)] if isinstance(value, torch.Tensor) else list(enumerate(value))
        for index, t in items:
            if t.layout != torch.strided or t.numel() == 0:  # the op's layout check names it
                continue
            if not dense(t):
                if written and any(n > 1 and st == 0 for n, st in zip(t.shape, t.stride())):
                    raise ValueError(f"{_label(name, index)} has elements that share memory (a stride of 0: an "
                                     "expanded tensor?), and the op writes it: pass a tensor of its own, e.g. .clone()")
                continue
            memory, begin, end = _place(t)
            out.append((memory, begin, end, name, index, partner, t))
    return out


def check_operands(reads, writes):
    """``reads``: (name, tensor or list or None, in-place partner list's name or None);
    ``writes``: (name, tensor or list or None). Raises ValueError as aliasing.h does."""
    from ._validate import same_layout
    ws = _spans([(n, v, None) for n, v in writes], True)
    rs = _spans(reads, False)
    by_memory = {}
    for w in sorted(ws, key=lambda s: (s[0], s[1])):
        by_memory.setdefault(w[0], []).append(w)
    for spans in by_memory.values():
        far = spans[0]
        for w in spans[1:]:
            if w[1] < far[2]:
                raise ValueError(f"{_label(far[3], far[4])} and {_label(w[3], w[4])} share memory, and the op "
                                 "writes both: give each its own memory")
            if w[2] > far[2]:
                far = w
    ends = {memory: [s[2] for s in spans] for memory, spans in by_memory.items()}
    for memory, begin, end, name, index, partner, t in rs:
        spans = by_memory.get(memory)
        if not spans:
            continue
        k = bisect.bisect_right(ends[memory], begin)
        if k == len(spans) or spans[k][1] >= end:
            continue
        w = spans[k]
        if partner is not None and partner == w[3] and index == w[4]:
            if not (w[1] == begin and w[2] == end and w[6].shape == t.shape and same_layout(w[6], t)):
                raise ValueError(f"{_label(w[3], w[4])} partly overlaps {_label(name, index)} in memory; write in "
                                 "place (the same tensor) or into separate memory")
            continue
        advice = "an output may only be its own input (in place)" if partner else "give each its own memory"
        raise ValueError(f"{_label(w[3], w[4])} shares memory with {_label(name, index)}: the op reads one while "
                         f"it writes the other, in parallel; {advice}")
