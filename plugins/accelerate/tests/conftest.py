"""The small task shared with the Lightning plugin's tests (tests/support/small_task.py),
and a fresh Accelerate state for every in-process test (Accelerate keeps one per
process)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[3] / "tests" / "support"))


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    from accelerate.state import AcceleratorState, GradientState
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
