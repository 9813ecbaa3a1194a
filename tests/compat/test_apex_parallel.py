"""apex.parallel under the alias takes Apex's arguments as Apex did: DistributedDataParallel
in Apex's positional order with its retired keywords, SyncBatchNorm's fuse_relu, z and
_specify_process_group. In this process, on a gloo group of one rank."""

import pytest
import torch
import torch.distributed as dist
from torch import nn

import core_ops.compat.apex  # noqa: F401
import core_ops.parallel


def test_apex_positional_order(world1):
    from apex.parallel import DistributedDataParallel
    model = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
    # module, message_size, delay_allreduce, shared_param, allreduce_trigger_params,
    # retain_allreduce_buffers, allreduce_always_fp32, num_allreduce_streams,
    # allreduce_communicators, gradient_average, gradient_predivide_factor,
    # gradient_average_split_factor, prof
    ddp = DistributedDataParallel(model, 1e3, False, None, [model[0].weight], True, True, 2,
                                  None, False, 2.0, None, True)
    assert isinstance(ddp, core_ops.parallel.DistributedDataParallel)
    assert ddp.message_size == 1000 and not ddp.delay_allreduce
    assert ddp._grads.trigger_ids == {id(model[0].weight)}
    assert ddp.retain_allreduce_buffers and ddp.allreduce_always_fp32
    assert ddp.num_allreduce_streams == 2 and not ddp.gradient_average
    assert ddp.gradient_predivide_factor == 2.0 and ddp.prof


def test_apex_keywords(world1):
    from apex.parallel import DistributedDataParallel
    from apex.parallel.distributed import DistributedDataParallel as FromDistributed
    from apex.parallel.distributed import flat_dist_call  # noqa: F401
    assert FromDistributed is DistributedDataParallel
    ddp = DistributedDataParallel(nn.Linear(2, 2), message_size=1e7, shared_param=None,
                                  allreduce_communicators=None, gradient_average_split_factor=None,
                                  prof=False, process_group=None)
    x = torch.randn(3, 2)
    ddp(x).sum().backward()
    assert torch.equal(ddp.module.bias.grad, torch.full((2,), 3.0))  # a world of one: the local grad
    with pytest.warns(FutureWarning, match="renamed gradient_predivide_factor"):
        ddp = DistributedDataParallel(nn.Linear(2, 2), gradient_average_split_factor=4.0)
    assert ddp.gradient_predivide_factor == 4.0


def test_apex_retired_arguments_are_clear_errors(world1):
    from apex.parallel import DistributedDataParallel
    with pytest.raises(ValueError, match="shared_param=True: Apex removed.*delay_allreduce=True"):
        DistributedDataParallel(nn.Linear(2, 2), shared_param=True)
    with pytest.raises(ValueError, match="allreduce_communicators: .*not on NCCL communicator "
                                         "objects.*process_group="):
        DistributedDataParallel(nn.Linear(2, 2), allreduce_communicators=[object()])
    with pytest.raises(ValueError, match="name the same setting"):
        DistributedDataParallel(nn.Linear(2, 2), gradient_predivide_factor=2.0,
                                gradient_average_split_factor=4.0)


def test_apex_syncbn_fuse_relu_z_and_group():
    """Apex's optimized SyncBatchNorm(fuse_relu) and forward(input, z) with channel_last
    (N, H, W, C); no process group: one process is its own batch."""
    from apex.parallel import SyncBatchNorm
    from apex.parallel.optimized_sync_batchnorm import SyncBatchNorm as Optimized
    assert Optimized is SyncBatchNorm is core_ops.parallel.SyncBatchNorm
    bn = SyncBatchNorm(4, channel_last=True, fuse_relu=True).double()
    ref = nn.BatchNorm2d(4).double()
    x, z = torch.randn(2, 3, 3, 4, dtype=torch.float64), torch.randn(2, 3, 3, 4, dtype=torch.float64)
    expected = torch.relu(ref(x.movedim(-1, 1)) + z.movedim(-1, 1)).movedim(1, -1)
    torch.testing.assert_close(bn(x, z), expected, rtol=1e-12, atol=1e-12)  # float64: rounding only
    bn._specify_process_group("a group")
    assert bn.process_group == "a group" and "fuse_relu=True" in repr(bn)
    with pytest.raises(ValueError, match=r"z must have the input's shape \(2, 3, 3, 4\)"):
        bn(x, z[:1])


def test_apex_parallel_submodules_are_attributes():
    """Apex's apex.parallel had its submodules and ReduceOp as attributes; code reaches
    them without importing them."""
    import apex.parallel
    assert apex.parallel.distributed.DistributedDataParallel is apex.parallel.DistributedDataParallel
    assert apex.parallel.sync_batchnorm.SyncBatchNorm is core_ops.parallel.SyncBatchNorm
    assert apex.parallel.optimized_sync_batchnorm.SyncBatchNorm is core_ops.parallel.SyncBatchNorm
    assert apex.parallel.ReduceOp.SUM == dist.ReduceOp.SUM
