"""The Accelerate plugin on 2 gloo processes, through `accelerate launch` itself: the
plugin in code (accelerate_runs.py) and, with no change to the script and no `-m
core_ops_accelerate`, from a config file plus CORE_OPS_* variables (plain_train.py). Tolerances: bit for bit where the same
kernels run in the same order (ranks after DDP, a resume); 2 ranks against one process
differ in the order of float32 sums (the allreduce, SyncBatchNorm's merged
statistics): 1e-5."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parents[3] / "tests" / "support"))
import small_task as task  # noqa: E402

HERE = Path(__file__).parent
ACCELERATE = str(Path(sys.executable).with_name("accelerate"))
CPU_CONFIG = """compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU
num_processes: 2
num_machines: 1
machine_rank: 0
gpu_ids: all
mixed_precision: 'no'
use_cpu: false
main_training_function: main
"""


def launch(args, out, env=None, name=None, timeout=420, ranks=2):
    env = dict(os.environ, ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **(env or {}))
    proc = subprocess.run([ACCELERATE, "launch", *args], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return [torch.load(out / f"{name}-rank{r}.pt", weights_only=False) for r in range(ranks)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("accelerate")
    return launch(["--multi_gpu", "--num_processes", "2", str(HERE / "accelerate_runs.py"), "launch", str(out)],
                  out, name="launch")


def test_o2_ranks_seeded_apart_stay_identical_with_core_ops_ddp_and_syncbn(runs):
    r0, r1 = runs
    assert r0["o2"]["model"] == "core_ops.parallel.distributed.DistributedDataParallel"
    assert r0["o2"]["dtypes"] == ["torch.float16", "torch.float32"] and r0["o2"]["bn"] == ["SyncBatchNorm"]
    for i, (a, b) in enumerate(zip(r0["o2"]["steps"], r1["o2"]["steps"])):
        assert torch.equal(a["params"], b["params"]), f"step {i}"


def test_an_inf_on_one_rank_skips_the_step_and_the_scheduler_on_both(runs):
    for r in runs:  # rank 1's loss is inf at step 2
        steps = r["o2"]["steps"]
        assert [s["skipped"] for s in steps] == [False, False, True, False]
        assert torch.equal(steps[1]["params"], steps[2]["params"])
        assert steps[1]["lr"] == steps[2]["lr"] > steps[3]["lr"]


def test_clipping_returns_the_true_norm_on_every_rank(runs):
    r0, r1 = runs
    for a, b in zip(r0["o2"]["steps"], r1["o2"]["steps"]):
        if not a["skipped"]:
            assert a["norm"] == b["norm"] and 0.5 < a["norm"] < 5  # the unscaled norm, not x 65536


def test_two_ranks_with_syncbn_equal_one_process_on_the_whole_batch(runs):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    from core_ops_accelerate import ApexPlugin
    accelerator = Accelerator(kwargs_handlers=[ApexPlugin(opt_level="O0", sync_bn=True)])
    model = task.conv_net(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt = accelerator.prepare(model, opt)
    for x, y in task.loader(batch=32):
        accelerator.backward(F.cross_entropy(model(x), y))
        opt.step()
        opt.zero_grad()
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    torch.testing.assert_close(runs[0]["o0_syncbn"], task.flat(model.parameters()), rtol=1e-5, atol=1e-6)


def test_accumulating_micro_batches_send_no_collective(runs):
    assert runs[0]["collectives"] == [0, 2, 0, 2]


def test_save_state_then_load_state_continues_exactly(runs):
    for r in runs:
        assert torch.equal(r["whole"], r["resumed"])
        assert r["saved_dtypes"] == ["torch.float32"]
    assert torch.equal(runs[0]["whole"], runs[1]["whole"])


def test_an_unmodified_script_switched_on_by_the_environment(tmp_path):
    (tmp_path / "cfg.yaml").write_text(CPU_CONFIG)
    env = dict(CORE_OPS_OPT_LEVEL="O2", CORE_OPS_SYNC_BN="1", CORE_OPS_FUSED_OPTIMIZER="1")
    # `accelerate launch train.py`, no `-m core_ops_accelerate`: the installed plugin
    # loads itself in each rank (Note [Plugin autoload] in core_ops_autoload.py).
    r0, r1 = launch(["--config_file", str(tmp_path / "cfg.yaml"), str(HERE / "plain_train.py"), str(tmp_path)],
                    tmp_path, env=env, name="plain")
    assert r0["wrapper"] == "core_ops.parallel.distributed.DistributedDataParallel"
    assert r0["optimizer"] == "FusedAdam" and r0["bn"] == ["SyncBatchNorm"]
    assert r0["dtypes"] == ["torch.float16", "torch.float32"]
    assert torch.equal(r0["params"], r1["params"])
    assert sum(r0["losses"][-4:]) < sum(r0["losses"][:4])  # it learns
