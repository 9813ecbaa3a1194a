"""Process-group helpers shared by DistributedDataParallel, Reducer and SyncBatchNorm."""

import torch
import torch.distributed as dist

# all_gather_single replaced all_gather_into_tensor in recent torch; both take
# (output, input, group, async_op).
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def require_initialized(who):
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"{who}: torch.distributed is not initialized (process_group has nothing to "
            "use): call torch.distributed.init_process_group(...) first, e.g. under torchrun")


def world_size(group):
    """Size of ``group`` (None: the default group); 1 when torch.distributed is not
    initialized, so single-process code needs no special case."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def global_src(group, rank_in_group=0):
    """The global rank of ``rank_in_group`` in ``group`` (broadcast takes global ranks)."""
    if group is None or group is dist.group.WORLD:
        return rank_in_group
    return dist.get_global_rank(group, rank_in_group)


def comm_device(group, tensor_device):
    """Where a collective's tensors must live: NCCL needs CUDA tensors, gloo takes any."""
    backend = dist.get_backend(group)
    if backend == "nccl" and tensor_device.type != "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return tensor_device


def all_gather_flat(tensor, group):
    """(world, *tensor.shape): every rank's ``tensor``, stacked in rank order."""
    out = tensor.new_empty((world_size(group),) + tuple(tensor.shape))
    _all_gather_flat(out.view(-1), tensor.reshape(-1).contiguous(), group=group)
    return out
