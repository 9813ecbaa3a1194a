"""core_ops' fused optimizers (every one of the registry, tests/optimizers/optimizer_registry.py,
generic test "sharded") on params sharded by FSDP2 (DTensors), 2 and 4 gloo ranks (Note
[Sharded params] in core_ops/_sharded.py). On a GPU: test_fsdp_cuda.py, over NCCL."""

import torch
from _launch import run_ranks
from sharded_optimizer_workers import WHOLE_NORMS


def test_elementwise_optimizers_on_sharded_params_match_torch_optim():
    # Tolerance: the same float32 formulas over 4 steps; core_ops may fuse a*b + c into
    # one FMA where torch rounds twice (a few ulps).
    for result in run_ranks("sharded_optimizer_workers:elementwise_optimizers", timeout=180):
        for name, r in result.items():
            assert r["state_types"] == ["DTensor"], name  # saved by DCP as torch.optim's
            for ours, theirs in zip(r["ours"], r["torch"]):
                torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6, msg=name)


def test_lamb_novograd_and_clipping_take_whole_tensor_norms_in_one_collective():
    # Against the same optimizer on an unsharded copy fed every rank's batch. Tolerance:
    # the shards' squares are summed in another order than one tensor's (float32, a few
    # ulps a norm), and FSDP2 averages grads in another order than the mean of the
    # copy's losses; 4 steps of lr 0.01 keep that within 1e-5 relative.
    # 4 ranks: the 3-element bias leaves one rank an empty shard; and HSDP, a 2 x 2 mesh
    # replicating over one dim and sharding over the other: norms summed over the shard
    # dim only, so the replicas are not counted twice.
    for world in (2, 4):
        results = run_ranks("sharded_optimizer_workers:whole_norm_optimizers", world_size=world, timeout=180)
        assert len(results[0]) == len(WHOLE_NORMS) * (1 if world == 2 else 2)
        for result in results:
            for key, r in result.items():
                name = key.split()[0]
                for ours, theirs in zip(r["sharded"], r["whole"]):
                    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6, msg=f"{key} on {world}")
                expected = WHOLE_NORMS[name][2]  # all_reduce calls a step (sharded_optimizer_workers.py)
                assert r["all_reduces"] == [expected] * 4, (key, r["all_reduces"])
                if r["whole_grad_norm"] is not None:
                    torch.testing.assert_close(r["grad_norm"], r["whole_grad_norm"], rtol=1e-5, atol=0)


def test_loss_scalers_skip_an_overflow_in_one_shard_on_every_rank():
    for result in run_ranks("sharded_optimizer_workers:under_loss_scalers", timeout=180):
        theirs, their_scale = result.pop("torch")
        assert their_scale == 2.0 ** 7  # one skipped step
        for name, (ours, our_scale) in result.items():
            assert our_scale == their_scale, name
            for a, b in zip(ours, theirs):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
