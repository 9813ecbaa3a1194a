"""DistributedDataParallel on 2 gloo ranks where autograd or the model is out of the
ordinary: reentrant activation checkpointing (a param readied twice in one backward;
grads first readied in a nested backward), sparse embeddings, the default group given
explicitly next to SyncBatchNorm, deep copies. One launch per scenario (~5 s each)."""

from _launch import run_ranks

# fp32 grads of magnitude ~1 reduced by gloo against the same values reduced by hand
# with dist.all_reduce: the same sums of two values, so equal up to the one rounding in
# which the averaging differs (pre-divided vs divided after): Note [DDP tolerances].
FP32_TOL = 1e-6


def test_grad_grown_after_its_ready_is_taken_until_its_bucket_is_sent():
    """A param shared by two use_reentrant=True checkpoints: its hook fires twice in a
    backward. Its bucket takes the sum while not yet launched; after that (or when the
    sum cannot be recovered) it is a clear error, not a silently wrong grad."""
    for rank in run_ranks("ddp_edge_workers:shared_reentrant", timeout=90):
        assert max(rank["diffs"]) <= FP32_TOL, rank["diffs"]
        for error in rank["errors"]:
            assert error is not None
            assert "'shared.weight'" in error or "'shared.bias'" in error
            assert "grew after its bucket's allreduce had started" in error
            assert "use_reentrant=False" in error and "delay_allreduce=True" in error


def test_param_readied_twice_is_reduced_once_with_delay_allreduce():
    for diffs in run_ranks("ddp_edge_workers:shared_reentrant_delay", timeout=90):
        assert max(diffs) <= FP32_TOL, diffs


def test_grads_first_readied_in_a_nested_backward_are_reduced_once():
    """Reentrant checkpointing at the output end: one finish per backward, in the
    outer backward, so each bucket is allreduced once and summed grads are not 2x."""
    for rank in run_ranks("ddp_edge_workers:checkpointed_head", timeout=90):
        for (average, message_size), res in rank.items():
            case = f"average={average} message_size={message_size}"
            assert max(res["diffs"]) <= FP32_TOL, (case, res)
            assert res["allreduces"] == [res["buckets"]] * 3, (case, res)


def test_sparse_gradients_are_a_clear_error():
    for errors in run_ranks("ddp_edge_workers:sparse", timeout=90):
        assert "sparse=True in '0' (Embedding)" in errors["construction"]
        assert "sparse=False" in errors["construction"]
        assert "'0.weight' is sparse" in errors["backward"]
        assert "sparse=False" in errors["backward"]


def test_explicit_world_group_beside_syncbn_gets_a_private_group():
    """Before: gloo aborted ("Received data size doesn't match expected size")."""
    for rank in run_ranks("ddp_edge_workers:explicit_world_group", timeout=90, pg_timeout_s=20):
        assert rank["private"]
        assert max(rank["diffs"]) <= FP32_TOL, rank["diffs"]


def test_deepcopy_runs_no_collective_and_the_copy_trains():
    for rank in run_ranks("ddp_edge_workers:deep_copied", timeout=90):
        assert rank["collectives"] == []
        assert rank["same_group"] and rank["grads_none"] and not rank["shares_storage"]
        assert max(rank["diffs"]) <= FP32_TOL, rank["diffs"]
