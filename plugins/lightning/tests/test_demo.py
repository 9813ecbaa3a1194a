"""The README's demo (examples/digits.py) runs end to end: 2 processes, the table, the
plot. Short: 2 epochs, two of its four runs."""

import os
import re
import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).parents[1] / "examples" / "digits.py"


def test_the_demo_trains_and_prints_its_table(tmp_path):
    png = tmp_path / "loss.png"
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, str(DEMO), "--epochs", "3", "--runs", "apex-O2:apex-ddp,32-true:ddp",
                           "--plot", str(png)], capture_output=True, text=True, timeout=420, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    rows = {m[1]: m.groups() for m in re.finditer(
        r"^\| (\S+ \+ \S+) \| (yes|no \(GPU only\)) \| ([\d.]+)% \| ([\d.]+) \| (\d+) \| (\d+) \|$", proc.stdout, re.M)}
    assert set(rows) == {"apex-O2 + apex-ddp", "32-true + ddp"}, proc.stdout[-2000:]
    apex = rows["apex-O2 + apex-ddp"]
    assert apex[1] == "yes" and float(apex[2]) > 80.0  # 3 epochs reach ~95%
    assert "2 process(es) x 32 per batch" in proc.stdout
    assert "Epoch 2" in proc.stderr + proc.stdout  # Lightning's progress bar
    assert png.stat().st_size > 10_000
