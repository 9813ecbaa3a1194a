"""Apex's opt levels on FSDP2 (Note [Opt levels on FSDP2] in core_ops/amp/fsdp.py)
through amp.initialize and AmpLoop, on 2 and 4 gloo ranks, against core_ops' DDP."""

import pytest
import torch
from _launch import run_ranks


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def levels():
    """One launch: each level on FSDP2, on FSDP2 with CPUOffloadPolicy, and on DDP."""
    return run_ranks("fsdp_amp_workers:levels_against_ddp", timeout=240)


def test_opt_levels_on_fsdp2_train_as_on_ddp(levels):
    results = levels
    for rank, r in enumerate(results):
        # O0, O1 and O3 reduce grads in the dtype DDP does: the same bits.
        for level in ("O0", "O1", "O3"):
            assert torch.equal(r[level]["fsdp"], r[level]["ddp"]), (rank, level)
            assert _same(r[level]["fsdp_params"], r[level]["ddp_params"]), (rank, level)
        # O2: DDP rounds each step's mean grads to the bf16 grads of its half params
        # (2^-9 relative) before they reach the masters; FSDP2 reduce-scatters into the
        # float32 shards, no rounding. After 6 Adam steps of lr 0.01 (a param moves at
        # most 0.06) that moved params by 5.5e-4 and losses by up to 1.1e-3 relative on
        # 2 ranks, 3.1e-3 on 4 (2 rows a rank: noisier grads): bounds 2e-3 and 5e-3.
        torch.testing.assert_close(r["O2"]["fsdp"], r["O2"]["ddp"], rtol=5e-3, atol=0)
        for a, b in zip(r["O2"]["fsdp_params"], r["O2"]["ddp_params"]):
            torch.testing.assert_close(a, b, rtol=0, atol=2e-3)
        # The float32 shards are the masters: params and grads float32, each rank
        # holding half of them and of Adam's two moments; the blocks compute in bf16
        # and the model's output is float32, as Apex's O2.
        assert r["o2_dtypes"] == ["torch.float32"]
        assert r["o2_local"] <= r["whole"] / 2 + 16  # 16: a row more where rows are odd
        assert r["o2_state_local"] == 2 * r["o2_local"]
        assert r["o2_block_io"] == [("torch.bfloat16", "torch.bfloat16")] and r["o2_out"] == "torch.float32"
    assert sum(r["o2_local"] for r in results) == results[0]["whole"]


def test_cpu_offload_policy_trains_each_level_as_without_it(levels):
    """fully_shard(..., offload_policy=CPUOffloadPolicy()) under every opt level. On a
    CPU-only machine the shards are on the CPU already: the policy's copies between the
    CPU and the compute device are copies onto the same device, the collectives and
    FusedAdam's kernel see the same values, so the run is the plain FSDP2 run bit for
    bit. What this checks is that the policy is taken (every unit's params kept on the
    CPU by FSDP2) beside the opt level's mixed precision and O3's cast shards, and that
    FusedAdam steps the CPU shards with its state on the CPU, sharded as they are."""
    for rank, r in enumerate(levels):
        for level in ("O0", "O1", "O2", "O3"):
            run = r[level]
            assert run["offload_policies"] == [("CPUOffloadPolicy", True)], (rank, level)
            assert run["offload_devices"] == ["cpu"], (rank, level)
            assert run["offload_state"] == [("exp_avg", "DTensor"), ("exp_avg_sq", "DTensor"), ("step", "Tensor")]
            assert torch.equal(run["offload"], run["fsdp"]), (rank, level)
            assert _same(run["offload_params"], run["fsdp_params"]), (rank, level)


def test_o2_on_four_ranks_trains_as_on_ddp():
    results = run_ranks("fsdp_amp_workers:o2_against_ddp", world_size=4, timeout=240)
    for r in results:
        torch.testing.assert_close(r["O2"]["fsdp"], r["O2"]["ddp"], rtol=5e-3, atol=0)  # see the 2-rank test
        assert r["o2_local"] <= r["whole"] / 4 + 16
    assert sum(r["o2_local"] for r in results) == results[0]["whole"]


def test_an_overflow_in_one_shard_skips_the_step_on_every_rank_and_clipping_takes_the_global_norm():
    results = run_ranks("fsdp_amp_workers:overflow_and_clipping", timeout=240)
    for rank, r in enumerate(results):
        steps = r["steps"]
        # Step 0 overflows fp16 at the initial scale 2^16 on its own; step 2 has an inf in
        # rank 0's shard only. Both skip on both ranks with nothing changed, halving the scale.
        assert [s["skipped"] for s in steps] == [True, False, True, False], rank
        assert [s["scale"] for s in steps] == [2.0**15, 2.0**15, 2.0**14, 2.0**14], rank
        for s in (steps[0], steps[2]):
            assert s["params_same"] and s["state_same"]
        for s in (steps[1], steps[3]):
            assert not s["params_same"] and not s["state_same"]
            # The norm clip_grad_norm_ returns is the whole model's (from the gathered
            # grads): float32 sums in another order, a few ulps.
            torch.testing.assert_close(s["norm"], s["true_norm"], rtol=1e-6, atol=0)
            torch.testing.assert_close(s["clipped"], torch.tensor(0.05), rtol=1e-5, atol=0)
    for a, b in zip(results[0]["steps"], results[1]["steps"]):
        assert torch.equal(a["norm"], b["norm"])  # every rank clips by the same norm


def test_resume_from_sharded_and_full_checkpoints_is_exact(tmp_path, monkeypatch):
    monkeypatch.setenv("FSDP_CHECKPOINT_DIR", str(tmp_path))
    results = run_ranks("fsdp_amp_workers:resume", timeout=300)
    for rank, r in enumerate(results):
        losses, params, state, amp_state = r["straight"]
        for form in ("sharded", "full"):
            f_losses, f_params, f_state, f_amp = r[form]
            assert torch.equal(f_losses, losses), (rank, form)
            assert _same(f_params, params), (rank, form)
            assert all(torch.equal(a[k], b[k]) for a, b in zip(f_state, state) for k in a), (rank, form)
            assert f_amp == amp_state, (rank, form)
    # The full checkpoint holds plain float32 tensors: a plain model loads it.
    assert results[0]["full_dtypes"] == ["torch.float32"] and results[0]["full_types"] == ["Tensor"]
    # The same full checkpoint resumed on 4 ranks (and into an unsharded model): the
    # state exactly, then the next step's loss as the 2-rank run's (the same global
    # batch, split 4 ways: the same params, fp16 matmuls of other batch sizes).
    other = run_ranks("fsdp_amp_workers:resume_on_other_world", world_size=4, timeout=240)
    for r in other:
        assert r["params_equal"] and r["plain_equal"] and r["state_equal"]
        assert r["scale"] == r["saved_scale"]
    four = torch.cat([r["loss"] for r in other]).mean()
    two = torch.stack([r["straight"][0][3] for r in results]).mean()
    torch.testing.assert_close(four, two, rtol=1e-3, atol=0)


def test_edges_and_misuse_named_with_the_route_that_works():
    both = run_ranks("fsdp_amp_workers:edges", timeout=120)
    errors = both[0]
    assert "sharded by fully_shard after amp.initialize" in errors["sharded_after"]
    assert "has already run forward" in errors["ran_before"] and "fsdp_policy" in errors["ran_before"]
    assert "parameter '1.0.weight' is not sharded" in errors["unsharded_param"]
    assert "build the optimizer after sharding" in errors["optimizer_before"]
    assert "holds BatchNorm (BatchNorm1d) beside other layers" in errors["batchnorm"]
    assert "fully_shard(bn)" in errors["batchnorm"]
    # BatchNorm in a unit of its own computes in float32 (its running stats stay float32)
    # between bf16 layers: its unit casts the input up and its output down for the next.
    assert errors["apart"] == [("Linear", "torch.bfloat16", "torch.bfloat16"),
                               ("FSDPBatchNorm1d", "torch.float32", "torch.bfloat16"),
                               ("Linear", "torch.bfloat16", "torch.bfloat16")]
    assert errors["apart_running_mean"] == "torch.float32"
    assert (errors["kept_policy"].param_dtype, errors["kept_policy"].reduce_dtype) == (torch.bfloat16, torch.bfloat16)
    assert "gathers params in torch.bfloat16 (its mp_policy) but the opt level computes in torch.float16" in \
        errors["other_half"]
    # A model built on the meta device, each rank initializing only its shards: every
    # Linear's weight as nn.Linear draws it (uniform within 1/sqrt(fan_in), not the
    # zeros or garbage of to_empty), then a finite first O2 step.
    for fan_in, largest, std in errors["meta_init"]:
        assert 0 < largest <= fan_in ** -0.5 and std > 0.25 * fan_in ** -0.5
    assert torch.isfinite(errors["meta_losses"]).all()
