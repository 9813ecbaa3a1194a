"""CI's slice of the fuzz harness (tests/fuzz/run.py): seed 0, a fixed number of cases
per op, every op through every route, legal and faulty calls, in a child process. The
longer run is one command: `python tests/fuzz/run.py` (3 seeds, 10 minutes each), and
`bash tools/sanitize.sh tests/fuzz/run.py` under ASan + UBSan."""

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
CASES = 25  # per op: about a minute for the 22 ops on 2 cores


@pytest.fixture(scope="module")
def fuzz():
    sys.path.insert(0, str(HERE))
    import run
    return run


def test_the_fuzz_slice_finds_nothing(fuzz):
    lines = []
    findings, counts = fuzz.fuzz([0], cases=CASES, say=lines.append)
    assert set(counts) == set(fuzz.specs()) and all(n == CASES for n in counts.values())
    assert not findings, "\n".join(lines + [fuzz.reproducer(f["op"], f["seed"], f["case"]) for f in findings])


def test_every_native_op_is_fuzzed(fuzz):
    from core_ops._library import OP_NAMES
    assert set(fuzz.specs()) == set(OP_NAMES)


def test_a_finding_is_reported_with_its_reproducer(fuzz, monkeypatch):
    # A route that adds 1 to what the op wrote: the harness must say so, per case.
    from core_ops._library import op

    def off_by_one(src, dst, scale, found_inf):
        op("multi_tensor_scale_")(src, dst, scale, found_inf)
        for t in dst:
            t.add_(1)
    monkeypatch.setattr(fuzz, "routes_of", lambda op_name, only=None: {"raw": off_by_one})
    found = []
    for index in range(6):
        found += fuzz.run_case("multi_tensor_scale_", 0, index)
    assert any("relative error" in f["finding"] for f in found), found
    assert all(f["op"] == "multi_tensor_scale_" and f["seed"] == 0 for f in found)
    assert fuzz.reproducer("multi_tensor_scale_", 0, 3) == "python tests/fuzz/run.py --repro multi_tensor_scale_:0:3"
