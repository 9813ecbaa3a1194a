"""DistributedDataParallel on 2 gloo ranks: gradients against one process on the
global batch and against torch's DistributedDataParallel, half precision, no_sync,
unused params, Apex's scaling options, overlap, state dicts, Reducer. The ranks run
ddp_workers.suite once (one launch, ~20 s); each test asserts on its part."""

import pytest

from _launch import run_ranks

# Note [DDP tolerances]: each rank's loss is the mean over its half of the batch, the
# reference's the mean over the whole batch; the two sums of per-sample grads are
# associated differently, so fp32 grads (of magnitude ~1) differ by a few ulps: 1e-6.
# Against torch's DDP on 2 ranks the result is bit-identical: torch computes
# a/2 + b/2, we (a + b) / 2, and halving is exact in binary floating point.
FP32_TOL = 1e-6


@pytest.fixture(scope="module")
def ranks():
    return run_ranks("ddp_workers:suite", timeout=120)


@pytest.mark.parametrize("case", ["fp32", "fp32_delay"])
def test_grads_equal_full_batch_and_torch_ddp(ranks, case):
    for r in ranks:
        res = r[case]
        assert res["after_broadcast"] == 0.0  # rank 1 started from other weights
        assert max(res["vs_full"]) <= FP32_TOL, res["vs_full"]
        assert res["vs_torch"] == [0.0, 0.0, 0.0]
        assert res["buckets"] == 3  # message_size=40 elements splits the 3 layers
        assert res["grads_in_buffers"]  # grads are views of the flat buffers
    for a, b in zip(ranks[0][case]["params"], ranks[1][case]["params"]):
        assert (a == b).all()  # three SGD steps later the ranks still agree


@pytest.mark.parametrize("case,dtype", [("fp16", "torch.float16"), ("bf16", "torch.bfloat16")])
def test_half_grads_reduced_in_their_dtype(ranks, case, dtype):
    """Half grads are summed in their own dtype: the error against an fp64 run of the
    same half weights is at most torch DDP's (which also reduces in the grad dtype)."""
    for r in ranks:
        res = r[case]
        assert res["buffer_dtypes"] == [dtype] and res["grad_dtypes"] == [dtype]
        assert res["err_ours"] <= res["err_torch"] * 1.01 + 1e-6


def test_allreduce_always_fp32(ranks):
    for r in ranks:
        res = r["bf16_fp32"]
        assert res["buffer_dtypes"] == ["torch.float32"] and res["grad_dtypes"] == ["torch.bfloat16"]
        assert res["err_ours"] <= res["err_torch"] * 1.01 + 1e-6


@pytest.mark.parametrize("case,dtype,grad_dtype", [("fp32_as_bf16", "torch.bfloat16", "float32"),
                                                   ("fp32_as_fp16", "torch.float16", "float32"),
                                                   ("fp64_as_fp32", "torch.float32", "float64")])
def test_allreduce_dtype_compresses_grads(ranks, case, dtype, grad_dtype):
    """Grads sent in a narrower dtype (fp32 as bf16 / fp16, fp64 as fp32): bit-equal to
    rounding each rank's grad, summing with one rounding and widening back (the
    worker's docstring says how), both on a fresh step and when the second backward
    accumulates into the existing grads."""
    for r in ranks:
        res = r[case]
        assert res["buffer_dtypes"] == [dtype] and res["grad_dtypes"] == [grad_dtype]
        assert res["diffs"] == [0.0, 0.0]
        assert res["same_buffers"]  # kept and reused, not reallocated each step


@pytest.mark.parametrize("config", ["always_fp32", "as_bf16"])
def test_params_of_mixed_dtypes(ranks, config):
    """bf16 rounding of the reduced grads (8 mantissa bits): relative error <= 2^-7."""
    for r in ranks:
        res = r["mixed_dtypes"][config]
        assert res["dtypes_match"]
        assert res["err"] <= 2.0 ** -7, res["err"]


def test_no_sync_grads_survive_a_synced_backward_that_skips_them(ranks):
    for r in ranks:
        res = r["no_sync_then_unused"]
        assert res["b_grads"] is not None and res["b_grads"] <= FP32_TOL, res
        assert res["a"] <= FP32_TOL


def test_failure_while_finishing_leaves_no_stale_bucket(ranks):
    for r in ranks:
        res = r["failed_finish"]
        assert res["raised"]
        assert res["diff"] <= FP32_TOL, res["diff"]


def test_no_sync_accumulates_then_reduces(ranks):
    for r in ranks:
        res = r["no_sync"]
        assert res["allreduces_inside_no_sync"] == [0, 0]
        assert max(res["vs_full"]) <= FP32_TOL


def test_unused_and_frozen_params(ranks):
    """Branch b is used on rank 1 only, c on no rank, frozen needs no grad: no hang, b's
    grad is the average with rank 0 counting zeros, c and frozen keep grad None."""
    for r in ranks:
        for step in r["unused"]:
            assert step["a"] <= FP32_TOL and step["b"] <= FP32_TOL
            assert step["c_none"] and step["frozen_none"]


def test_overlap_is_real(ranks):
    """Order of events in one backward, recorded by hooks registered after DDP's and by
    a wrapper around dist.all_reduce: buckets are launched between grad hooks, the first
    long before the last grad is ready."""
    for r in ranks:
        res = r["overlap"]
        kinds = res["kinds"]
        assert kinds.count("launch") == res["buckets"] == 7
        assert res["first_launch"] < res["last_grad"]
        assert kinds.index("launch") < kinds.count("grad") // 2  # early in backward
        launches_before_last_grad = kinds[:res["last_grad"]].count("launch")
        assert launches_before_last_grad >= res["buckets"] - 1
        assert kinds[-1] == "backward returned"


def test_predivide_sum_and_trigger_params(ranks):
    for r in ranks:
        res = r["scaling"]
        for case in ("predivide", "sum", "sum_predivide", "trigger"):
            assert res[case] <= 2 * FP32_TOL, case
        assert res["trigger_buckets"] == 2  # closed after the trigger param, then the rest


def test_state_dict_has_no_prefix_and_buffers_follow_rank0(ranks):
    for r in ranks:
        res = r["state"]
        assert res["keys"] == ["lin.bias", "lin.weight", "offset"]
        assert res["offset_after_forward"] == [0.0, 0.0, 0.0]  # rank 1 had 7s
        assert res["loaded_bare"] == [3.0, 3.0, 3.0]
        assert res["loaded_prefixed"] == [5.0, 5.0, 5.0]
        assert res["fresh"] == [5.0, 5.0, 5.0]


def test_reducer(ranks):
    for a, b in zip(ranks[0]["reducer"]["params"], ranks[1]["reducer"]["params"]):
        assert (a == b).all()  # broadcast from rank 0 at construction
    for r in ranks:
        res = r["reducer"]
        assert res["weight_grad"] == [1.5]
        assert res["bias_grad"] == [1.0]  # (0 + 2) / 2: rank 0 had no grad
        assert res["unused_grad_is_none"]  # no rank had one: None, not zeros
        assert res["bf16_collectives"] == 1  # the used flags ride in the bf16 grads' buffer
        assert res["bf16_grad"] == [1.5]
        assert res["list_values"] == [[0.5], [0.5]]


def test_params_unfrozen_after_wrapping_are_reduced(ranks):
    for r in ranks:
        res = r["refrozen"]
        assert max(res["diffs"]) <= FP32_TOL, res["diffs"]
        assert res["frozen_grads_none"] and res["refreshed"]


def test_disable_then_enable_allreduce(ranks):
    for r in ranks:
        res = r["disable_allreduce"]
        assert res["local_differ"]  # the first backward was not reduced
        assert res["summed"] <= 2 * FP32_TOL  # the second reduced the sum of both


def test_state_dict_of_a_model_with_a_child_named_module(ranks):
    for r in ranks:
        res = r["child_named_module"]
        assert res["keys"] == ["head.bias", "head.weight", "module.bias", "module.weight"]
        assert res["clean"] and res["bare_ok"] and res["prefixed_ok"]
        assert res["missing"] == ["head.bias", "module.bias", "module.weight"]  # as the user spells them
        assert res["unexpected"] == ["extra"]


def test_flat_dist_call_as_apex(ranks):
    for r in ranks:
        assert r["flat_dist_call"] == dict(averaged=[[1.5] * 3, [1.5] * 2], broadcast=[5.0, 5.0])


def test_no_sync_is_decided_by_the_forward_as_in_torch(ranks):
    for r in ranks:
        res = r["no_sync_forward_decides"]
        assert res["first_local"]  # forward inside, backward outside: not reduced
        assert res["first"] <= FP32_TOL and res["second"] <= FP32_TOL  # both as torch's DDP


def test_a_frozen_discriminator_forward_then_its_own_step(ranks):
    for r in ranks:
        res = r["gan"]
        assert max(res["diffs"]) <= FP32_TOL, res["diffs"]
        assert res["replans"] == 0


def test_a_no_grad_forward_inside_no_sync_decides_nothing(ranks):
    for r in ranks:
        assert r["no_grad_forward"]["diff"] <= FP32_TOL


def test_grads_kept_across_zero_grad_are_not_overwritten(ranks):
    for r in ranks:
        assert r["kept_grads"] == dict(intact=True, changed=True, reused=True)
