"""bench/gpu_targets.py runs only when a GPU is lent, for minutes: a crash there costs
the measurement. Here it runs at --small sizes on the CPU and must print a measured
value for every target (the verdicts at these sizes mean nothing and are not checked)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_target_gets_a_measured_value():
    run = subprocess.run([sys.executable, "bench/gpu_targets.py", "--device", "cpu", "--small", "--skip", "demo",
                          "--repeats", "2", "--warmup", "1"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [ln for ln in run.stdout.splitlines() if ln.startswith("| ") and not ln.startswith("| target")]
    # norms: 2 kinds x 2 dtypes x (fwd+bwd, forward) at one --small shape; adam: 2; compact: 2;
    # step: 2 norms x 2 models (bf16).
    assert len(rows) == 8 + 2 + 2 + 4, run.stdout
    for row in rows:
        target, value, verdict = (c.strip() for c in row.strip("|").split("|"))
        assert re.fullmatch(r"-?\d+\.\d\d[x%]", value), row
        assert verdict in ("pass", "FAIL"), row
