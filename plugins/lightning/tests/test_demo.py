"""The README's demo (examples/char_lm.py) runs end to end: 2 processes, one line a run
while it trains, the table, the plot where the user asked for it; under 60 lines in
all. Short: 12 steps, three of its five runs."""

import os
import re
import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).parents[1] / "examples" / "char_lm.py"


def test_the_demo_trains_and_prints_its_table(tmp_path):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    runs = "apex-O2-bf16:apex-ddp,apex-O2-bf16+8bit:apex-ddp,32-true:ddp"
    proc = subprocess.run([sys.executable, str(DEMO), "--steps", "12", "--runs", runs,
                           "--plot", "runs.png"], capture_output=True, text=True, timeout=420, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    rows = {m[1]: m.groups() for m in re.finditer(
        r"^\| (.+? \+ \S+) \| (\d+) \| ([\d.]+)x \| ([\d.]+) \| (\d+) \| ([\d.]+) \|$", proc.stdout, re.M)}
    o2, eight, fp32 = "apex-O2-bf16 + apex-ddp", "apex-O2-bf16 + 8-bit Adam + apex-ddp", "32-true + ddp"
    assert set(rows) == {o2, eight, fp32}, proc.stdout[-2000:]
    assert rows[fp32][2] == "1.00"
    losses = {name: float(r[5]) for name, r in rows.items()}
    assert all(2.0 < loss < 4.5 for loss in losses.values())  # from ln(256) = 5.5: it learns
    assert abs(losses[o2] - losses[fp32]) < 0.02 * losses[fp32]  # bf16 O2 tracks float32 within 2%
    assert abs(losses[eight] - losses[o2]) < 0.01 * losses[o2]  # 8-bit moments and remainders track O2
    kept = {name: float(r[3]) for name, r in rows.items()}
    assert kept[eight] < 0.45 * kept[o2]  # 6 bytes a param (most tensors) against 14
    assert "2 x 16 sequences of 128 bytes" in proc.stdout
    assert len((proc.stdout + proc.stderr).splitlines()) < 60, proc.stdout + proc.stderr
    assert (tmp_path / "runs.png").stat().st_size > 10_000  # in the caller's folder
