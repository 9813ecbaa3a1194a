"""Params sharded across processes as DTensors (FSDP2's fully_shard, tensor parallel).

Note [Sharded params]: Adam, SGD and Adagrad update each element from that element's
grad and state alone, so updating every process's local shard is updating the whole
tensor: their kernels run on ``DTensor.to_local()`` views (which share the shard's
memory), and their state is made with ``zeros_like(param)``, so it is a DTensor laid
out as the param (torch.distributed.checkpoint saves it as torch.optim's). LAMB and
NovoGrad need each whole tensor's norm and clipping the global norm: a shard's would
be wrong, so those are refused rather than computed per shard. core_ops.amp's
LossScaler checks the local shards too, and reduces its overflow flag over their
meshes, so that every rank skips together.
"""

import torch


def _dtensor_type():
    if not torch.distributed.is_available():
        return ()
    from torch.distributed.tensor import DTensor
    return DTensor


# DTensor, or () without torch.distributed: looked up once, as each step asks (a global,
# not functools.cache, which torch.compile warns about when it traces the step).
_DTENSOR = None


def is_sharded(t):
    global _DTENSOR
    if _DTENSOR is None:
        _DTENSOR = _dtensor_type()
    return isinstance(t, _DTENSOR)


def local(t):
    """The process-local tensor of ``t`` (``t`` itself when it is not a DTensor)."""
    return t.to_local() if is_sharded(t) else t


def elementwise(kernel, params):
    """``kernel``, taking DTensors in its arguments as their local shards when
    ``params`` has any (Note [Sharded params])."""
    if not any(map(is_sharded, params)):
        return kernel
    return lambda *args: kernel(*(list(map(local, a)) if isinstance(a, list) else local(a) for a in args))


def refuse_sharded(params, where, why):
    """Raises if any of ``params`` is a DTensor: ``why`` says what needs the whole tensor."""
    if any(map(is_sharded, params)):
        raise ValueError(f"{where}sharded (DTensor) params, as FSDP2's fully_shard makes, are not "
                         f"supported: {why}. FusedAdam, FusedSGD and FusedAdagrad take them")
