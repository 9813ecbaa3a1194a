"""Building a plugin's wheel as pip does, and installing it into a throwaway venv that
leaves the development environment alone: the venv has site-packages of its own (a .pth
installed there runs only in it) and sees this environment's packages (torch,
core_ops) behind them. Nothing is downloaded: builds use this environment's setuptools."""

import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build_wheel(plugin, out):
    """The wheel of plugins/<plugin>, built into ``out``."""
    proc = pip(sys.executable, "wheel", "--no-deps", "--no-build-isolation", "-w", str(out),
               str(ROOT / "plugins" / plugin))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = Path(out).glob("*.whl")
    return wheel


def throwaway_venv(path):
    """A venv at ``path`` (no pip of its own: this environment's serves it); returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    python = Path(path) / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    # Named to run before any .pth installed beside it, which may import core_ops_autoload.
    (Path(site) / "00-development-environment.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    return python


def pip(python, *args):
    """``python -m pip args`` offline; the CompletedProcess."""
    return subprocess.run([str(python), "-m", "pip", "-q", "--disable-pip-version-check", "--no-input", *args,
                           *(["--no-index"] if args[0] in ("install", "wheel") else [])],
                          capture_output=True, text=True, timeout=300)
