"""The registry (optimizer_registry.py) is complete: every fused optimizer class of
core_ops.optimizers has an entry, each generic test an entry skips is one that exists
and is skipped for a stated reason, and each generic test is driven by the registry in
the file it names."""

import re
from pathlib import Path

import pytest
import torch
from optimizer_registry import GENERIC_TESTS, OPTIMIZERS, Config, Tolerance, cases

import core_ops.optimizers
from core_ops.optimizers._base import FusedOptimizer

TESTS = Path(__file__).resolve().parents[1]


def test_every_fused_optimizer_class_has_an_entry():
    classes = {getattr(core_ops.optimizers, name) for name in core_ops.optimizers.__all__}
    fused = {c for c in classes if isinstance(c, type) and issubclass(c, FusedOptimizer)}
    assert fused == {info.cls for info in OPTIMIZERS.values()}, "add an entry to optimizer_registry.py"


@pytest.mark.parametrize("info", cases())
def test_an_entry_says_why_for_each_test_it_skips(info):
    configs = [info.typical, info.every_path, *info.variants.values()]
    skipped = {**info.not_applicable, **{k: v for c in configs for k, v in c.not_applicable.items()}}
    assert set(skipped) <= set(GENERIC_TESTS), set(skipped) - set(GENERIC_TESTS)
    assert all(isinstance(why, str) and len(why) > 20 for why in skipped.values()), skipped
    for tolerance in (info.across_devices, info.against_reference):
        assert isinstance(tolerance, Tolerance) and tolerance.ulps >= 0 and len(tolerance.why) > 20
    assert all(isinstance(c, Config) and c.dtype in info.dtypes for c in configs)
    assert info.typical.dtype in (torch.float32, torch.bfloat16)
    params = [torch.zeros(4, dtype=info.typical.dtype, requires_grad=True)]
    assert all(type(info.make(params, c)) is info.cls for c in configs)


@pytest.mark.parametrize("test", list(GENERIC_TESTS))
def test_each_generic_test_takes_its_optimizers_from_the_registry(test):
    files = re.findall(r"[\w/]+\.py", GENERIC_TESTS[test])
    assert files
    sources = [(TESTS / f.removeprefix("tests/") if f.startswith("tests/") else TESTS / "optimizers" / f).read_text()
               for f in files]
    assert any(re.search(rf"""cases\([^)]*"{test}"|"{test}".*cases\(""", s) for s in sources), files
