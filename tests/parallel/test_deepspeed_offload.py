"""DeepSpeed's ZeRO-Offload (stages 2 and 3, ``offload_optimizer: cpu``) stepping core_ops'
FusedAdam as the client optimizer, on 2 gloo ranks and DeepSpeed's CPU accelerator: one
launch of deepspeed_offload_workers.py:stages, its runs compared here (docs/offload.md)."""

import pytest
import torch
from _launch import run_ranks

pytest.importorskip("deepspeed", reason="the test extra installs deepspeed")

FP32_ULP = torch.finfo(torch.float32).eps


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DS_CHECKPOINT_DIR", str(tmp_path_factory.mktemp("deepspeed")))
        return run_ranks("deepspeed_offload_workers:stages", timeout=240)


def _assert_fused_matches_adamw(runs, precision):
    fused, adamw = runs[precision, "fused"], runs[precision, "adamw"]
    # FusedAdam computes torch.optim's AdamW in its order (Note [Adam as torch.optim
    # computes it]) with every scalar rounded once in double, where torch's addcdiv
    # rounds value * (m / denom) its own way: a few float32 ulps a step, not the same
    # bits. Measured: 1.5e-8 after 4 steps, half an ulp of the largest |param| (0.26);
    # bound 8 ulps of it.
    bound = 8 * FP32_ULP * adamw["params"].abs().max().item()
    torch.testing.assert_close(fused["params"], adamw["params"], rtol=0, atol=bound)
    # The losses are of those params (one forward of a small MLP): ulps too.
    torch.testing.assert_close(fused["losses"], adamw["losses"], rtol=1e-6, atol=0)
    assert fused["client"] == "FusedAdam" and adamw["client"] == "AdamW"


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_offload_steps_fused_adam_on_its_cpu_partitions_as_adamw(ranks, stage):
    for r in ranks:
        runs = r[stage]
        for precision in ("fp32", "bf16") if stage == 2 else ("fp32",):
            _assert_fused_matches_adamw(runs, precision)
        for key, run in runs.items():
            if not isinstance(key, tuple):
                continue
            assert run["wrapper"] == ("DeepSpeedZeroOptimizer" if stage == 2 else "DeepSpeedZeroOptimizer_Stage3")
            # What FusedAdam steps is DeepSpeed's own: one flat float32 partition on the
            # CPU per rank, about half the model (DeepSpeed pads the partitions to its
            # alignment, a few elements), whatever the engine computes in.
            [(dtype, device, numel)] = run["stepped"]
            assert (dtype, device) == ("torch.float32", "cpu"), key
            assert r[stage]["whole"] / 2 <= numel <= r[stage]["whole"] / 2 + 8, (key, numel)
            assert torch.isfinite(run["losses"]).all() and run["losses"][-1] < run["losses"][0], key
    # The ranks end with the same whole params (every rank's partition gathered).
    for key in ranks[0][stage]:
        if isinstance(key, tuple):
            assert torch.equal(ranks[0][stage][key]["params"], ranks[1][stage][key]["params"]), key


@pytest.mark.parametrize("stage", [2, 3])
def test_compact_state_is_used_on_the_partitions_and_trains_close_to_fp32(ranks, stage):
    kinds = ("fused-bf16", "fused-int8") if stage == 2 else ("fused-int8",)
    for r in ranks:
        runs = r[stage]
        fp32 = runs["bf16", "fused"]
        numel = fp32["stepped"][0][2]
        assert fp32["state"] == {"step": "torch.float32", "exp_avg": "torch.float32", "exp_avg_sq": "torch.float32"}
        assert fp32["state_bytes"] == 2 * 4 * numel
        for kind in kinds:
            run = runs["bf16", kind]
            if kind == "fused-bf16":
                assert run["state"] == {"step": "torch.float32", "exp_avg": "torch.bfloat16",
                                        "exp_avg_sq": "torch.bfloat16"}
                assert run["state_bytes"] == 2 * 2 * numel
            else:  # codes, and each block of 256's float32 maximum
                assert run["state"] == {"step": "torch.float32", "exp_avg": "torch.uint8", "exp_avg_sq": "torch.uint8",
                                        "exp_avg_absmax": "torch.float32", "exp_avg_sq_absmax": "torch.float32"}
                assert run["state_bytes"] == 2 * (numel + 4 * -(-numel // 256))
            # The rounded moments change the updates (the compact path ran), but little:
            # bf16 moments are rounded to 2^-9, 8-bit ones to their map's step within a
            # block's maximum, each step; a param moves at most 4 steps of lr 0.01 in all.
            # Measured: params 1.1e-4 (bf16) and 8.8e-4 (8-bit) from the fp32-state run,
            # losses 4.5e-5 relative; bounds 5e-4, 4e-3 and 1e-3.
            assert not torch.equal(run["params"], fp32["params"]), kind
            bound = 5e-4 if kind == "fused-bf16" else 4e-3
            torch.testing.assert_close(run["params"], fp32["params"], rtol=0, atol=bound)
            torch.testing.assert_close(run["losses"], fp32["losses"], rtol=1e-3, atol=0)


def test_deepspeed_checkpoints_resume_8bit_state_exactly(ranks):
    """engine.save_checkpoint after 2 steps, load_checkpoint into a fresh engine, 2 more:
    DeepSpeed saves FusedAdam's state_dict (codes and maxima) and loads it back."""
    for r in ranks:
        straight, resumed = r[2]["bf16", "fused-int8"], r[2]["resumed"]
        assert resumed["loaded_state"]["exp_avg"] == "torch.uint8"
        assert torch.equal(resumed["losses"], straight["losses"])
        assert torch.equal(resumed["params"], straight["params"])


def test_deepspeeds_moment_accessor_reads_8bit_codes_as_numbers(ranks):
    """A limit docs/offload.md states: safe_get_full_optimizer_state copies the client's
    state into float32; bf16 moments come back widened, 8-bit ones as their codes."""
    for stage in (2, 3):
        runs = ranks[0][stage]
        real = runs["bf16", "fused"]["ds_exp_avg"]
        assert real.abs().max() < 1  # a first moment of grads clipped to norm 0.5
        codes = runs["bf16", "fused-int8"]["ds_exp_avg"]
        assert torch.equal(codes, codes.round()) and codes.min() >= 0 and codes.max() <= 255 and codes.max() > 1
        if stage == 2:
            # bf16 moments: the fp32-state run's, to bf16's rounding (2^-9 of each) and
            # the difference that rounding made to 4 steps' grads: measured 3.4e-3 of the
            # largest |moment|; bound 1e-2 of it.
            torch.testing.assert_close(runs["bf16", "fused-bf16"]["ds_exp_avg"], real, rtol=0,
                                       atol=1e-2 * real.abs().max().item())
