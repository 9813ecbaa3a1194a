"""Checks shared by the extension stand-ins: Apex's kernels took raw pointers and
trusted their callers; these name what is wrong instead."""

from __future__ import annotations

import math

import torch


def rows(fn, input, normalized_shape, *params):
    """``input`` as (rows, hidden) for ``normalized_shape``; the params (None allowed)
    must hold ``hidden`` elements in that shape."""
    shape = tuple([normalized_shape] if isinstance(normalized_shape, int) else normalized_shape)
    if not torch.is_tensor(input):
        raise TypeError(f"{fn}: input must be a tensor, got {type(input).__name__}")
    if not shape or tuple(input.shape[input.dim() - len(shape):]) != shape:
        raise ValueError(f"{fn}: normalized_shape {list(shape)} must be the trailing dims of the "
                         f"input, whose shape is {list(input.shape)}")
    for name, p in params:
        if p is not None and tuple(p.shape) != shape:
            raise ValueError(f"{fn}: {name} has shape {list(p.shape)}; expected normalized_shape {list(shape)}")
        if p is not None and p.device != input.device:
            raise ValueError(f"{fn}: {name} is on {p.device}, the input on {input.device}")
    hidden = math.prod(shape)
    return input.reshape(-1, hidden), hidden


def tensor_lists_of(tensor_lists, depth, name):
    """``tensor_lists`` as lists, checked to be ``depth`` of them (an int, or a tuple of
    the depths allowed): the check every ``amp_C`` function makes first."""
    depths = (depth,) if isinstance(depth, int) else depth
    if not isinstance(tensor_lists, (list, tuple)) or len(tensor_lists) not in depths:
        raise ValueError(f"{name} takes {' or '.join(map(str, depths))} tensor lists, got "
                         f"{len(tensor_lists) if isinstance(tensor_lists, (list, tuple)) else tensor_lists!r}")
    return [list(ts) for ts in tensor_lists]
