"""Running one call on a route and comparing what it did with the reference's.

A call's outcome is either the error it raised (class and message) or every tensor it
could have touched (its arguments, after the call) and what it returned. Two outcomes
agree when both raised the same class with the same message, or both returned and
every tensor matches within the tolerance of its dtype. An error that is not a
ValueError or TypeError naming what is wrong (torch's own RuntimeError from inside a
kernel, an IndexError, ZeroDivisionError) is itself a finding: "unclear"."""

import copy
import re

import torch

# How far a native result may be from the reference's, relative to the largest value
# of the tensor (Note [Test tolerances] in tests/conftest.py: the kernels and the
# reference round in a different order, sum in a different order, and the reference's
# torch ops may fuse a multiply-add): a few roundings of the dtype.
REL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
TYPED = (ValueError, TypeError)
# Refusals that name what is wrong but come from torch itself, before any kernel runs.
TORCH_SAYS = (
    re.compile(r"^Expected a value of type"),  # the schema's own argument checks
    re.compile(r"a leaf Variable that requires grad"),
)


class NotThisRoute(Exception):
    """Raised by a route given a call its caller cannot make (routes_optimizers.py): the
    case is left to the other routes."""


class Raised:
    def __init__(self, error):
        # A subclass of ValueError or TypeError (SparseGradError, which is a RuntimeError
        # too, for torch.optim's callers) is compared as that class.
        self.kind = next((c.__name__ for c in TYPED if isinstance(error, c)), type(error).__name__)
        self.message = _strip(str(error))

    def __repr__(self):
        return f"{self.kind}: {self.message}"


def _strip(message):
    # A native kernel called as torch.ops.core_ops.* raises RuntimeError with a
    # "[ValueError] " tag (Note [Typed errors]); op() turns it into the class. Only the
    # first line: torch appends where in C++ it was thrown.
    return message.split("\n")[0].strip()


def run(fn, args):
    """(the args after the call, the result or a Raised)."""
    args = copy.deepcopy(args)  # views of one storage stay views of one (new) storage
    try:
        result = fn(*args)
    except NotThisRoute:
        raise
    except Exception as e:  # noqa: BLE001: any error is an outcome
        return args, Raised(e)
    return args, result


def tensors_of(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_of(v)]
    return []


def unclear(raised):
    """Why an error is not a clear refusal, or None when it is one."""
    if raised.kind in ("ValueError", "TypeError") and raised.message:
        return None
    if any(p.search(raised.message) for p in TORCH_SAYS):
        return None
    return f"unclear error {raised!r}"


def loosest(args, factor=1.0):
    """The tolerance of the least precise floating dtype among ``args``' tensors, times
    ``factor``: a float64 output computed from float32 input (a norm's weight grad in
    the weight's dtype) is as exact as float32 math, not more."""
    rels = [REL[t.dtype] for t in tensors_of(args) if t.dtype in REL]
    return max(rels, default=0.0) * factor


def compare(got, want, same_message=True, rel=0.0, floors=None):
    """None when outcome ``got`` agrees with ``want`` (the reference's), else why not;
    each value within the larger of its dtype's tolerance and ``rel``, relative to the
    tensor's largest value or, where ``floors`` ({position in the outcome's tensors:
    magnitude}) says so, to the magnitude of the terms it was computed from."""
    (got_args, got_result), (want_args, want_result) = got, want
    if isinstance(want_result, Raised) or isinstance(got_result, Raised):
        if not (isinstance(want_result, Raised) and isinstance(got_result, Raised)):
            return f"reference: {_said(want_result)}; route: {_said(got_result)}"
        why = unclear(got_result) or unclear(want_result)
        if why:
            return why
        if got_result.kind != want_result.kind or (same_message and got_result.message != want_result.message):
            return f"errors differ: reference {want_result!r}; route {got_result!r}"
        return None
    got_ts, want_ts = tensors_of([got_args, got_result]), tensors_of([want_args, want_result])
    if len(got_ts) != len(want_ts):
        return f"{len(got_ts)} tensors against the reference's {len(want_ts)}"
    for k, (g, w) in enumerate(zip(got_ts, want_ts)):
        why = _differs(g, w, rel, (floors or {}).get(k, 0.0))
        if why:
            return f"tensor {k} of the outcome ({list(w.shape)} {w.dtype}): {why}"
    return None


def _said(result):
    return repr(result) if isinstance(result, Raised) else "returned"


def _differs(g, w, rel=0.0, floor=0.0):
    if g.dtype != w.dtype or g.shape != w.shape:
        return f"got {list(g.shape)} {g.dtype}"
    if w.device.type == "meta" or g.numel() == 0:
        return None
    if not w.is_floating_point():
        if w.dtype == torch.uint8:  # 8-bit codes: a tie may round to either neighbour
            diff = (g.int() - w.int()).abs().max().item()
            return None if diff <= 1 else f"codes differ by {diff}"
        return None if torch.equal(g, w) else f"{g.reshape(-1)[:8].tolist()} != {w.reshape(-1)[:8].tolist()}"
    gd, wd = g.double(), w.double()
    if not torch.equal(gd.isnan(), wd.isnan()):
        return "nan in other places"
    if not (torch.equal(gd.isinf(), wd.isinf()) and torch.equal(gd[gd.isinf()], wd[wd.isinf()])):
        return "inf in other places"
    finite = wd.isfinite()
    if not finite.any():
        return None
    scale = wd[finite].abs().max().clamp(min=max(floor, 1e-30))
    err = ((gd - wd)[finite].abs().max() / scale).item()
    bound = max(REL[w.dtype], rel)
    return None if err <= bound else f"relative error {err:.3g} > {bound:.3g}"
