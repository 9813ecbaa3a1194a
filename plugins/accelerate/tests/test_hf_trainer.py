"""The HF Trainer under the CORE_OPS_* variables alone (Note [Settings that stop the
run]): a set variable takes effect or stops the run, and its message is the last line
the user reads even though transformers imports accelerate lazily and wraps errors."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the HF Trainer tests need transformers (the test extra has it)")
SCRIPT = Path(__file__).parent / "hf_trainer_train.py"


def run(tmp_path, **env):
    base = {k: v for k, v in os.environ.items() if not k.startswith("CORE_OPS_")}
    return subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=dict(base, PYTHONWARNINGS="ignore", **env))


def test_remainders_take_effect_with_the_trainers_adamw(tmp_path):
    """CORE_OPS_MASTER_WEIGHTS=remainder with no CORE_OPS_FUSED_OPTIMIZER: the Trainer's
    torch AdamW steps as FusedAdam keeping the remainders, its schedule driving it, and
    the "active" line shows every setting."""
    proc = run(tmp_path, CORE_OPS_OPT_LEVEL="O2", CORE_OPS_HALF_DTYPE="bf16", CORE_OPS_MASTER_WEIGHTS="remainder")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1] == "stepped FusedAdam remainder torch.bfloat16 True"
    active = [line for line in proc.stderr.splitlines() if line.startswith("core-ops: every Accelerator")]
    assert len(active) == 1 and "master_weights=remainder (CORE_OPS_MASTER_WEIGHTS)" in active[0], proc.stderr
    assert "fused_optimizer=None" in active[0] and "sync_bn=False" in active[0]


def test_the_remainder_variable_alone_stops_naming_what_to_set(tmp_path):
    proc = run(tmp_path, CORE_OPS_MASTER_WEIGHTS="remainder")
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == (
        "ValueError: core-ops: CORE_OPS_MASTER_WEIGHTS='remainder' is set but CORE_OPS_OPT_LEVEL is not, so nothing "
        "would read it: set CORE_OPS_OPT_LEVEL=O2 CORE_OPS_HALF_DTYPE=bf16 (O0-O3), or pass "
        "kwargs_handlers=[ApexPlugin(opt_level=...)], or unset CORE_OPS_MASTER_WEIGHTS")


def test_a_misspelt_variable_is_the_last_line_under_transformers_lazy_import(tmp_path):
    proc = run(tmp_path, CORE_OPS_OPT_LEVLE="O2")
    assert proc.returncode != 0
    assert "Could not import module 'GPT2LMHeadModel'" in proc.stderr  # transformers' own error, above ours
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "core-ops: the CORE_OPS_* settings, which failed: BadEnvironment: unknown environment variable "
        "CORE_OPS_OPT_LEVLE (did you mean CORE_OPS_OPT_LEVEL?)"), proc.stderr[-2000:]
