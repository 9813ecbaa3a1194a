"""Data parallelism on torch.distributed (gloo on CPU, NCCL on CUDA), with Apex's API:
``from apex.parallel import X`` becomes ``from core_ops.parallel import X``."""

from ..optimizers import LARC
from .convert import convert_syncbn_model, create_syncbn_process_group, revert_syncbn_model
from .distributed import DistributedDataParallel
from .options import DDPOptions, FSDPOptions
from .reducer import Reducer
from .sync_batchnorm import SyncBatchNorm

__all__ = ["DDPOptions", "DistributedDataParallel", "FSDPOptions", "LARC", "Reducer", "SyncBatchNorm", "convert_syncbn_model",
           "create_syncbn_process_group", "revert_syncbn_model"]
