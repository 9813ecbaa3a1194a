"""Note [Plugin autoload] (core_ops_autoload.py): with the plugins installed, Lightning's
apex-* names work and an Accelerate script gets ApexPlugin from CORE_OPS_OPT_LEVEL with
no import of the plugin, in fresh processes as a user starts them; CORE_OPS_AUTOLOAD=0
turns both off; a process that imports neither framework loads neither plugin; and
the plugins' wheels carry the .pth files that do it (the development environment,
installed editable, gets the same files from tools/setup.sh)."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "support"))
from plugin_wheels import build_wheel  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
QUIET = "accelerator='cpu', devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False"


def python(code, **env):
    base = {k: v for k, v in os.environ.items() if not k.startswith("CORE_OPS_")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(base, PYTHONWARNINGS="ignore", **env), cwd="/")
    return proc


LIGHTNING = f"""
import sys
import lightning as L
import pytorch_lightning
print('trainer', L.Trainer(precision='apex-O2', strategy='apex-ddp', {QUIET}).precision)
print('fabric', L.Fabric(precision='apex-O2-bf16', accelerator='cpu', devices=1)._precision.precision)
print('standalone', pytorch_lightning.Trainer(precision='apex-O1', {QUIET}).precision)
"""


def test_lightning_names_work_without_importing_the_plugin():
    proc = python(LIGHTNING)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["trainer", "apex-O2", "fabric", "apex-O2-bf16", "standalone", "apex-O1"]


def test_lightning_autoload_is_off_with_its_variable():
    proc = python(LIGHTNING + "\nprint('loaded', 'core_ops_lightning' in sys.modules)", CORE_OPS_AUTOLOAD="0")
    assert proc.returncode != 0 and "invalid strategy name: `strategy='apex-ddp'`" in proc.stderr, proc.stderr[-3000:]


ACCELERATE = """
import sys
from accelerate import Accelerator
import torch
acc = Accelerator(cpu=True)
net = torch.nn.Linear(4, 4)
model, opt = acc.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
print(type(acc).__name__, next(model.parameters()).dtype, 'core_ops_accelerate' in sys.modules)
"""


@pytest.mark.parametrize("env, want", [
    (dict(CORE_OPS_OPT_LEVEL="O2"), "torch.float16 True"),
    (dict(CORE_OPS_OPT_LEVEL="O2", CORE_OPS_AUTOLOAD="0"), "torch.float32 False"),
    ({}, "torch.float32 False"),  # no variable: the plugin is not even imported
], ids=["opt_level", "opt_out", "unset"])
def test_an_accelerate_script_run_with_python_gets_the_plugin_from_the_environment(env, want):
    proc = python(ACCELERATE, **env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[1:] == want.split(), proc.stdout


def test_a_process_that_imports_neither_framework_loads_nothing():
    proc = python("import sys, json; print(sorted(m for m in sys.modules if m.startswith(('core_ops', 'torch', "
                  "'lightning', 'accelerate'))))", CORE_OPS_OPT_LEVEL="O2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['core_ops_autoload']"


@pytest.mark.parametrize("plugin", ["lightning", "accelerate"])
def test_the_wheel_carries_the_autoload_file(plugin, tmp_path):
    wheel = build_wheel(plugin, tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    pth = f"core-ops-{plugin}-autoload.pth"
    assert pth in names  # at the top: site-packages, where Python's site runs it
    assert zipfile.ZipFile(wheel).read(pth).decode() == (ROOT / "plugins" / plugin / pth).read_text()


# Note [Settings that stop the run]: a CORE_OPS_* variable that is set takes effect or
# stops the run with its name.

@pytest.mark.parametrize("env, error", [
    (dict(CORE_OPS_OPT_LEVLE="O2"), "unknown environment variable CORE_OPS_OPT_LEVLE (did you mean CORE_OPS_OPT_LEVEL?)"),
    (dict(CORE_OPS_OPT_LEVEL="O2", CORE_OPS_HALF_DTYPES="bf16"),
     "CORE_OPS_OPT_LEVEL='O2' asks for core_ops_accelerate, which failed: BadEnvironment: unknown environment "
     "variable CORE_OPS_HALF_DTYPES (did you mean CORE_OPS_HALF_DTYPE?)"),
    (dict(CORE_OPS_OPT_LEVEL="O7"), "CORE_OPS_OPT_LEVEL='O7': expected one of O0, O1, O2, O3"),  # at Accelerator()
], ids=["typo_alone", "typo_beside_the_level", "bad_value"])
def test_a_setting_that_cannot_take_effect_stops_an_accelerate_script(env, error):
    proc = python(ACCELERATE, **env)
    assert proc.returncode != 0 and error in proc.stderr, proc.stderr[-3000:]


def test_a_typo_stops_a_lightning_script_too():
    proc = python(LIGHTNING, CORE_OPS_SKIP_NONFINTE="0")
    assert proc.returncode != 0, proc.stdout
    assert "unknown environment variable CORE_OPS_SKIP_NONFINTE (did you mean CORE_OPS_SKIP_NONFINITE?)" in proc.stderr


def test_core_ops_says_once_that_the_environment_switched_it_on():
    proc = python(ACCELERATE + "\nAccelerator(cpu=True)\n", CORE_OPS_OPT_LEVEL="O2", CORE_OPS_HALF_DTYPE="bf16")
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if line.startswith("core-ops: ")]
    assert len(said) == 1, proc.stderr[-2000:]
    # Every effective setting, and where the variables set one.
    assert said[0].startswith("core-ops: every Accelerator runs with ApexPlugin(opt_level=O2 (CORE_OPS_OPT_LEVEL), "
                              "half_dtype=bfloat16 (CORE_OPS_HALF_DTYPE), loss_scale=None, "), said
    from core_ops import settings
    assert all(f"{name}=" in said[0] for name in settings.ROUTES["accelerate"])


@pytest.mark.parametrize("env", [dict(CORE_OPS_HALF_DTYPE="bf16"), dict(CORE_OPS_MESSAGE_SIZE="4096")],
                         ids=["half_dtype", "ddp_option"])
def test_a_plugin_variable_without_an_opt_level_stops_an_accelerate_script(env):
    proc = python(ACCELERATE, **env)
    (name, value), = env.items()
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == (
        f"ValueError: core-ops: {name}={value!r} is set but CORE_OPS_OPT_LEVEL is not, so nothing would read it: "
        f"set CORE_OPS_OPT_LEVEL=O2 (O0-O3), or pass kwargs_handlers=[ApexPlugin(opt_level=...)], or unset {name}")


LAZY = """
import types
class Lazy(types.ModuleType):  # as transformers' _LazyModule: imports on first use, wraps any error
    def __getattr__(self, name):
        try:
            import accelerate
        except Exception as e:
            raise ModuleNotFoundError(f"Could not import module {name!r}") from e
        return accelerate
Lazy("hub").Accelerator
"""


def test_a_bad_variable_stays_the_last_line_under_a_lazy_importer():
    proc = python(LAZY, CORE_OPS_OPT_LEVEL="O2", CORE_OPS_HALF_DTYPES="bf16")
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert "ModuleNotFoundError: Could not import module 'Accelerator'" in lines
    assert lines[-1].startswith("core-ops: CORE_OPS_OPT_LEVEL='O2' asks for core_ops_accelerate, which failed: "
                                "BadEnvironment: unknown environment variable CORE_OPS_HALF_DTYPES (did you mean "
                                "CORE_OPS_HALF_DTYPE?)"), lines[-3:]
