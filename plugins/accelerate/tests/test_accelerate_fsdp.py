"""ApexPlugin on Accelerate's FSDP2, 2 gloo processes through `accelerate launch`
(accelerate_fsdp_runs.py: on CPU the script sets the state's distributed type to FSDP
itself, the one step Accelerate takes only from GPU kinds of run), against multi-CPU
data parallelism with the same batches."""

import pytest
import torch
from test_launches import HERE, launch


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("accelerate_fsdp")
    return launch(["--multi_gpu", "--num_processes", "2", str(HERE / "accelerate_fsdp_runs.py"), str(out)], out,
                  name="fsdp")


def _check_against_data_parallel(runs):
    for r in runs:
        for a, b in zip(r["fsdp"], r["ddp"]):
            # Data parallelism rounds each step's mean grads to the bf16 half params'
            # grads before the masters (2^-9 relative); FSDP2 reduce-scatters into float32
            # shards. Norms: that rounding, 2e-3; losses 3e-3 apart after 6 clipped Adam
            # steps of lr 0.01 (a param moves at most 0.06; they moved 3.9e-3 apart).
            torch.testing.assert_close(a["norm"], b["norm"], rtol=2e-3, atol=0)
            torch.testing.assert_close(a["loss"], b["loss"], rtol=5e-3, atol=0)
            torch.testing.assert_close(a["params"], b["params"], rtol=0, atol=1e-2)
        assert torch.equal(r["fsdp"][0]["loss"], r["ddp"][0]["loss"])  # the same model before any step
    for other in runs[1:]:
        for a, b in zip(runs[0]["fsdp"], other["fsdp"]):
            assert torch.equal(a["params"], b["params"]) and torch.equal(a["norm"], b["norm"])
    assert sum(r["fsdp_local"] for r in runs) == runs[0]["whole"]


def test_accelerate_shards_and_the_opt_level_takes_the_shards(runs):
    for r in runs:
        # Accelerate's auto-wrap policy made the units; O2 made them gather in bf16 and
        # the float32 shards are the masters.
        assert r["fsdp_units"] == ["FSDPBlock", "FSDPSequential"]
        assert r["fsdp_param_dtypes"] == ["torch.bfloat16"]
        assert r["fsdp_dtypes"] == ["torch.float32"] and r["fsdp_types"] == ["DTensor"]


def test_fsdp2_trains_as_data_parallel_and_clips_by_the_global_norm(runs):
    _check_against_data_parallel(runs)


def test_fsdp2_cpu_offload_trains_as_without_it(runs):
    """FullyShardedDataParallelPlugin(fsdp_version=2, cpu_offload=CPUOffloadPolicy(...)):
    every unit Accelerate shards takes FSDP2's CPU offload, FusedAdam's state is on the
    CPU shards. On a CPU-only machine the shards are on the CPU already (the policy's
    copies are onto the same device; the same collectives and kernels on the same
    values), so the run is the bf16 run without it, bit for bit."""
    for r in runs:
        assert r["offload_of"] == [("CPUOffloadPolicy", True)]
        assert r["offload_optimizer"] == "FusedAdam" and r["offload_state_devices"] == ["cpu"]
        assert len(r["offload"]) == len(r["fsdp"]) == 6
        for a, b in zip(r["offload"], r["fsdp"]):
            assert torch.equal(a["params"], b["params"]) and torch.equal(a["loss"], b["loss"])
            assert torch.equal(a["norm"], b["norm"])


def test_fsdp2_on_four_processes(tmp_path):
    _check_against_data_parallel(launch(["--multi_gpu", "--num_processes", "4", str(HERE / "accelerate_fsdp_runs.py"),
                                         str(tmp_path)], tmp_path, name="fsdp4", ranks=4))


def test_an_overflow_on_one_rank_skips_the_step_on_both(runs):
    for r in runs:  # fp16: step 0 overflows at the first scale; rank 1's loss is inf at step 2
        assert [(h["skipped"], h["scale"]) for h in r["fp16"]] == [
            (True, 2.0**15), (False, 2.0**15), (True, 2.0**14), (False, 2.0**14), (False, 2.0**14), (False, 2.0**14)]
        assert torch.equal(r["fp16"][1]["params"], r["fp16"][2]["params"])


def test_save_state_and_load_state_resume_exactly(runs):
    for r in runs:
        straight, resumed = r["fp16_straight"][3:], r["resumed"]
        assert len(resumed) == 3
        for a, b in zip(straight, resumed):
            assert torch.equal(a["params"], b["params"]) and torch.equal(a["loss"], b["loss"])
            assert a["scale"] == b["scale"]
