"""Params sharded across processes as DTensors (FSDP2's fully_shard, tensor parallel).

Note [Sharded params]: Adam, SGD and Adagrad update each element from that element's
grad and state alone, so updating every process's local shard is updating the whole
tensor: their kernels run on ``DTensor.to_local()`` views (which share the shard's
memory), and their state is made with ``zeros_like(param)``, so it is a DTensor laid
out as the param (torch.distributed.checkpoint saves it as torch.optim's). LAMB,
NovoGrad and clipping need each whole tensor's norm: each rank takes the norms of its
local shards in one multi-tensor pass, and ``whole_norms`` reduces them over the
ranks holding the other shards, one all_reduce for every tensor sharded alike (FSDP2:
one a norm pass), so every rank computes the same norms, and the same step, as an
unsharded run (to float32 rounding: a sum of shards' squares is added in another
order). core_ops.amp's LossScaler checks the local shards too, and reduces its
overflow flag over their meshes, so that every rank skips together.
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


def locals_of(tensors):
    return [local(t) for t in tensors]


def _shard_key(t, where):
    """(mesh, the mesh dims ``t`` is split over) for a DTensor split somewhere, else None
    (a tensor whole on every rank: its norm is already the whole tensor's)."""
    if not is_sharded(t):
        return None
    if any(p.is_partial() for p in t.placements):
        raise ValueError(f"{where}a DTensor with a Partial placement ({t.placements}) holds "
                         "unreduced values; norms need Shard or Replicate placements")
    dims = tuple(i for i, p in enumerate(t.placements) if p.is_shard())
    return (t.device_mesh, dims) if dims else None


def whole_norms(tensors, local_norms, norm_type=2, where=""):
    """The norm of each whole tensor of ``tensors`` (DTensors or not), from
    ``local_norms``, the 1-d float tensor of the norms of their local shards (L2 for
    ``norm_type`` 2, max|t| for 0): squares summed, or maxima taken, over the ranks
    holding each tensor's other shards (Note [Sharded params]). A collective: every
    rank of the meshes must call it, with its shards of the same tensors."""
    keys = [_shard_key(t, where) for t in tensors]
    if not any(keys):
        return local_norms
    import torch.distributed as dist
    l2 = norm_type == 2
    values = local_norms.square() if l2 else local_norms.clone()
    by_key = {}
    for i, key in enumerate(keys):
        if key is not None:
            by_key.setdefault(key, []).append(i)
    for (mesh, dims), indices in by_key.items():
        index = torch.tensor(indices, device=values.device)
        part = values.index_select(0, index)
        for dim in dims:
            dist.all_reduce(part, op=dist.ReduceOp.SUM if l2 else dist.ReduceOp.MAX,
                            group=mesh.get_group(dim))
        values.index_copy_(0, index, part)
    return values.sqrt() if l2 else values


def meshes_of(tensors):
    """The device meshes of the DTensors among ``tensors``, each once."""
    meshes = []
    for t in tensors:
        if is_sharded(t) and t.device_mesh not in meshes:
            meshes.append(t.device_mesh)
    return meshes


def max_over_meshes(flag, meshes):
    """``flag`` (a tensor, changed in place) made the max over every rank of ``meshes``:
    a rank whose shard overflowed makes every rank skip the step, so the shards stay
    one model. A collective when ``meshes`` is not empty."""
    for mesh in meshes:
        for dim in range(mesh.ndim):
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=mesh.get_group(dim))
    return flag
