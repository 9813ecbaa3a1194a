"""core-ops-apex-alias installed into a throwaway venv: ``import apex`` resolves to
core_ops in a plain ``python`` with no launcher; beside an installed ``apex`` the build
refuses and the alias stands aside, saying so once (Note [An alias that never shadows
Apex] in core_ops_apex_alias.py). The development environment never has it."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[3] / "tests" / "support"))
from plugin_wheels import ROOT, build_wheel, pip, throwaway_venv  # noqa: E402

IMPORTS = """
import sys
print('at start-up', 'torch' in sys.modules, type(sys.meta_path[0]).__name__)
import apex
from apex import amp
from apex.optimizers import FusedAdam
from apex.parallel import DistributedDataParallel
import amp_C, torch
norm, _ = amp_C.multi_tensor_l2norm(2048, torch.zeros(1, dtype=torch.int), [[torch.tensor([3.0, 4.0])]], False)
print(amp.__name__, FusedAdam.__module__, DistributedDataParallel.__module__, norm.item())
import core_ops.compat.apex, core_ops_apex_alias
print('names served by core_ops but not asked for at start-up:', set(core_ops.compat.apex._SHIMMED) - core_ops_apex_alias.NAMES)
"""


def run(python, code, **env):
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=300, cwd="/",
                          env=dict({k: v for k, v in os.environ.items() if not k.startswith("CORE_OPS_")}, **env))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    return build_wheel("apex-alias", tmp_path_factory.mktemp("wheel"))


def fake_apex(python):
    """A distribution named apex, as `pip install` of NVIDIA's (or PyPI's) leaves it."""
    site = Path(run(python, "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    (site / "apex").mkdir()
    (site / "apex" / "__init__.py").write_text("WHO = 'the installed apex'\n")
    (site / "apex-0.1.dist-info").mkdir()
    (site / "apex-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: apex\nVersion: 0.1\n")
    return site


def test_import_apex_with_no_launcher(wheel, tmp_path):
    pth = "core-ops-apex-alias.pth"
    assert {pth, "core_ops_apex_alias.py"} <= set(zipfile.ZipFile(wheel).namelist())  # at the top: site-packages
    assert zipfile.ZipFile(wheel).read(pth).decode() == (ROOT / "plugins" / "apex-alias" / pth).read_text()
    python = throwaway_venv(tmp_path / "venv")
    proc = pip(python, "install", "--no-deps", str(wheel))
    assert proc.returncode == 0, proc.stderr[-3000:]

    proc = run(python, IMPORTS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == [
        "at start-up False AliasOnFirstImport",  # the .pth imported no torch
        "core_ops.amp core_ops.optimizers.fused_adam core_ops.compat.apex.parallel 5.0",
        "names served by core_ops but not asked for at start-up: set()"]
    proc = run(python, "import apex", CORE_OPS_AUTOLOAD="0")
    assert proc.returncode != 0 and "No module named 'apex'" in proc.stderr
    # The development environment does not have it: it would change every other test.
    proc = run(sys.executable, "import apex")
    assert proc.returncode != 0 and "No module named 'apex'" in proc.stderr


def test_beside_an_installed_apex_the_build_refuses_and_the_alias_stands_aside(wheel, tmp_path):
    python = throwaway_venv(tmp_path / "venv")
    site = fake_apex(python)
    proc = pip(python, "install", "--no-deps", "--no-build-isolation", str(ROOT / "plugins" / "apex-alias"))
    assert proc.returncode != 0
    assert (f"core-ops-apex-alias: refusing to install: a distribution named apex (0.1, in {site}) is installed "
            "in this environment") in proc.stdout + proc.stderr, proc.stderr[-3000:]
    assert not list(site.glob("core_ops_apex_alias*"))

    # A wheel runs nothing when installed: the alias itself must stand aside at import.
    proc = pip(python, "install", "--no-deps", str(wheel))
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run(python, "import apex\nimport apex\nprint(apex.WHO, 'torch' in __import__('sys').modules)\n"
                       "try:\n    import amp_C\nexcept ImportError as e:\n    print(e)")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["the installed apex False", "No module named 'amp_C'"]
    said = [line for line in proc.stderr.splitlines() if "core-ops-apex-alias:" in line]
    assert len(said) == 1 and f"an `apex` package is installed ({site / 'apex'})" in said[0], proc.stderr
