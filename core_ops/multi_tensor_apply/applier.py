"""Apex's calling convention: ``multi_tensor_applier(op, noop_flag, tensor_lists, *args)``
calls ``op(chunk_size, noop_flag, tensor_lists, *args)``. With the functions of
``amp_C`` below as ``op``, code written against ``apex.multi_tensor_apply`` and
``amp_C`` keeps working."""


def tensor_lists_of(tensor_lists, depth, name):
    """``tensor_lists`` as lists, checked to be ``depth`` of them (an int, or a tuple of
    the depths allowed): the check every ``amp_C`` function makes first."""
    depths = (depth,) if isinstance(depth, int) else depth
    if not isinstance(tensor_lists, (list, tuple)) or len(tensor_lists) not in depths:
        raise ValueError(f"{name} takes {' or '.join(map(str, depths))} tensor lists, got "
                         f"{len(tensor_lists) if isinstance(tensor_lists, (list, tuple)) else tensor_lists!r}")
    return [list(ts) for ts in tensor_lists]


class MultiTensorApply:
    """Apex's applier. ``chunk_size`` is accepted for compatibility; the kernels choose
    their own chunking (Apex's chunk size was a CUDA launch detail)."""

    available = True
    warned = False

    def __init__(self, chunk_size=2048 * 32):
        self.chunk_size = chunk_size

    def check_avail(self):
        return None

    def __call__(self, op, noop_flag_buffer, tensor_lists, *args):
        return op(self.chunk_size, noop_flag_buffer, tensor_lists, *args)


multi_tensor_applier = MultiTensorApply(2048 * 32)
