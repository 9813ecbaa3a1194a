"""Bad input gives a clear error naming the problem. Runs in this process, on a gloo
group of one rank where a group is needed (created and destroyed per test)."""

import pytest
import torch
import torch.distributed as dist
from torch import nn

from core_ops.parallel import (DistributedDataParallel, Reducer, SyncBatchNorm,
                               create_syncbn_process_group)


def test_process_group_not_initialized():
    assert not dist.is_initialized()
    for make in (lambda: DistributedDataParallel(nn.Linear(2, 2)),
                 lambda: Reducer(nn.Linear(2, 2)),
                 lambda: create_syncbn_process_group(2)):
        with pytest.raises(RuntimeError, match="init_process_group"):
            make()


def test_module_without_trainable_params(world1):
    with pytest.raises(ValueError, match="no parameters that require grad"):
        DistributedDataParallel(nn.ReLU())
    with pytest.raises(ValueError, match="no parameters that require grad"):
        DistributedDataParallel(nn.Linear(2, 2).requires_grad_(False))


@pytest.mark.parametrize("size", [0, -5, 1.5, True])
def test_message_size(world1, size):
    with pytest.raises(ValueError, match="message_size"):
        DistributedDataParallel(nn.Linear(2, 2), message_size=size)


def test_message_size_as_an_integral_float(world1):
    """Apex's docs and scripts write message_size=1e7."""
    assert DistributedDataParallel(nn.Linear(2, 2), message_size=1e7).message_size == 10_000_000


def test_uninitialized_lazy_params(world1):
    with pytest.raises(ValueError, match=r"uninitialized \(lazy\) parameters: 0.weight, 0.bias. "
                                         "Run one forward with a dummy batch"):
        DistributedDataParallel(nn.Sequential(nn.LazyLinear(4), nn.ReLU(), nn.Linear(4, 1)))


def test_other_arguments(world1):
    with pytest.raises(ValueError, match="num_allreduce_streams"):
        DistributedDataParallel(nn.Linear(2, 2), num_allreduce_streams=0)
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        DistributedDataParallel(nn.Linear(2, 2), gradient_predivide_factor=0.0)
    with pytest.raises(ValueError, match="allreduce_trigger_params"):
        DistributedDataParallel(nn.Linear(2, 2), allreduce_trigger_params=[nn.Parameter(torch.ones(1))])
    with pytest.raises(TypeError, match="torch.nn.Module"):
        DistributedDataParallel(lambda x: x)
    with pytest.raises(ValueError, match=r"allreduce_dtype=torch.int8: expected torch.float32, float64, float16 or "
                                         r"bfloat16.*unset \(None\): each grad's own dtype"):
        DistributedDataParallel(nn.Linear(2, 2), allreduce_dtype=torch.int8)
    with pytest.raises(ValueError, match="allreduce_always_fp32=True contradicts allreduce_dtype"):
        DistributedDataParallel(nn.Linear(2, 2), allreduce_always_fp32=True,
                                allreduce_dtype=torch.bfloat16)


def test_already_wrapped(world1):
    model = nn.Linear(2, 2)
    wrapped = DistributedDataParallel(model)
    with pytest.raises(ValueError, match="already wrapped"):
        DistributedDataParallel(wrapped)
    with pytest.raises(ValueError, match="already wrapped"):
        DistributedDataParallel(model)  # the same module a second time
    with pytest.raises(ValueError, match="already wrapped"):
        DistributedDataParallel(nn.parallel.DistributedDataParallel(nn.Linear(2, 2)))


def test_world_of_one_trains(world1):
    """World size 1: the wrapper is transparent (grads as without it)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    ref = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    ref.load_state_dict(model.state_dict())
    ddp = DistributedDataParallel(model, message_size=5)
    for _ in range(2):
        x = torch.randn(5, 3)
        ddp.zero_grad()
        ref.zero_grad()
        ddp(x).sum().backward()
        ref(x).sum().backward()
        for a, b in zip(ddp.parameters(), ref.parameters()):
            assert torch.equal(a.grad, b.grad)


def test_syncbn_input_rank_and_reducer_list(world1):
    with pytest.raises(ValueError, match="2D to 5D input"):
        SyncBatchNorm(3)(torch.randn(3))
    with pytest.raises(TypeError, match="module_or_grads_list"):
        Reducer([])
    with pytest.raises(ValueError, match="does not divide"):
        create_syncbn_process_group(3) if dist.get_world_size() != 3 else None


def test_only_sparse_embeddings_are_refused(world1):
    """The check looks at nn.Embedding / nn.EmbeddingBag, not at any attribute named
    sparse (a sparse-attention block with dense params trains)."""
    class SparseAttention(nn.Linear):
        sparse = True

    model = DistributedDataParallel(nn.Sequential(SparseAttention(3, 3), nn.Linear(3, 1)))
    model(torch.ones(2, 3)).sum().backward()
    assert model.module[0].weight.grad is not None
    with pytest.raises(ValueError, match="sparse=True in '1' \\(EmbeddingBag\\)"):
        DistributedDataParallel(nn.Sequential(nn.Linear(3, 3), nn.EmbeddingBag(5, 3, sparse=True)))
