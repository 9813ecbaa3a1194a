"""CI's slice of the fuzz harness (tests/fuzz/run.py): seed 0, a fixed number of cases
per op, every op through every route, legal and faulty calls, in a child process. The
longer run is one command: `python tests/fuzz/run.py` (3 seeds, 10 minutes each), and
`bash tools/sanitize.sh tests/fuzz/run.py` under ASan + UBSan."""

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
CASES = 25  # per op: about a minute for the 25 specs on 2 cores


@pytest.fixture(scope="module")
def fuzz():
    sys.path.insert(0, str(HERE))
    import run
    return run


def test_the_fuzz_slice_finds_nothing_on_any_route(fuzz):
    lines, ran = [], {}
    findings, counts = fuzz.fuzz([0], cases=CASES, say=lines.append, ran=ran)
    assert set(counts) == set(fuzz.specs()) and all(n == CASES for n in counts.values())
    assert not findings, "\n".join(lines + [fuzz.reproducer(f["op"], f["seed"], f["case"]) for f in findings])
    # Each route took some of the calls: one that refused them all would compare nothing.
    untaken = [(name, route) for name in counts for route in fuzz.routes_of(name) if not ran.get((name, route))]
    assert not untaken, untaken


def test_every_native_op_is_fuzzed_on_every_route_to_it(fuzz):
    from core_ops._schemas import OP_NAMES
    specs = fuzz.specs()
    assert {name for name, spec in specs.items() if spec.native} == set(OP_NAMES)
    routes = {name: set(fuzz.routes_of(name)) for name in specs}
    assert all("raw" in routes[name] for name in OP_NAMES)
    # The public functions and Apex's amp_C where they exist; the optimizer classes;
    # Apex's norm extensions; the public autograd forms of the norms.
    assert all(routes[name] >= {"public"} for name in OP_NAMES if name.startswith("multi_tensor_"))
    assert {"amp_C"} <= routes["multi_tensor_scale_"] & routes["multi_tensor_axpby_"]
    optimizers = [name for name in OP_NAMES if name.startswith("fused_") and name.endswith("_")]
    assert len(optimizers) == 7
    assert all("amp_C" in routes[name] for name in optimizers if "compact" not in name)
    assert all("class" in routes[name] for name in optimizers if "lamb" not in name)
    norms = [name for name in OP_NAMES if name.endswith(("_fwd", "_bwd")) or name.startswith("sync_batch_norm")]
    assert len(norms) == 9
    assert all("apex" in routes[name] for name in norms if name != "fused_add_rms_norm_fwd")
    assert {"public", "apex"} <= routes["layer_norm_fwd+bwd"] & routes["rms_norm_fwd+bwd"]
    assert "public" in routes["fused_add_rms_norm_fwd+bwd"]
    assert "class" in routes["fused_lamb_stage1_+stage2_"]  # FusedLAMB.step: both stages, the norms between


def test_a_finding_is_reported_with_its_reproducer(fuzz, monkeypatch):
    # A route that adds 1 to what the op wrote: the harness must say so, per case.
    from core_ops._schemas import op

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
