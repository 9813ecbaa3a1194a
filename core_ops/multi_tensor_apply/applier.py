"""Apex's calling convention: ``multi_tensor_applier(op, noop_flag, tensor_lists, *args)``
calls ``op(chunk_size, noop_flag, tensor_lists, *args)``. With the functions of
Apex's ``amp_C`` extension (core_ops.compat.apex_extensions.amp_C) as ``op``, code
written against ``apex.multi_tensor_apply`` and ``amp_C`` keeps working."""


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
