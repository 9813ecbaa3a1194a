"""core_ops.checkpoints (Note [Atomic checkpoints]): save writes whole files or none,
latest takes the newest that loads, skipping torn files (with a warning naming them)
and save's temporary files. The killed-process cases run in
tests/parallel/test_restarts.py."""

import pytest
import torch

from core_ops import checkpoints


def test_save_replaces_whole_and_leaves_nothing_else(tmp_path):
    target = tmp_path / "run" / "step-0001.pt"
    checkpoints.save({"w": torch.arange(4)}, target)
    checkpoints.save({"w": torch.arange(5)}, target)  # over the old one
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["step-0001.pt"]
    assert torch.equal(torch.load(target, weights_only=True)["w"], torch.arange(5))


def test_latest_takes_the_newest_that_loads(tmp_path):
    for step in (1, 2, 3):
        checkpoints.save({"step": step}, tmp_path / f"step-{step:04d}.pt")
    whole = (tmp_path / "step-0003.pt").read_bytes()
    (tmp_path / "step-0004.pt").write_bytes(whole[: len(whole) // 2])  # torn by a kill
    (tmp_path / ".partial-123-step-0005.pt").write_bytes(whole)  # save's temporary file
    with pytest.warns(UserWarning, match=r"checkpoint \S+step-0004\.pt does not load .*the one before it"):
        path, loaded = checkpoints.latest(tmp_path, "step-*.pt")
    assert path.name == "step-0003.pt" and loaded == {"step": 3}
    path, loaded = checkpoints.latest(tmp_path, "step-*.pt", at_most=2)
    assert path.name == "step-0002.pt" and loaded == {"step": 2}
    assert checkpoints.latest(tmp_path / "none", "step-*.pt") == (None, None)


class Thing:
    pass


def test_latest_refuses_pickled_classes(tmp_path):
    torch.save({"thing": Thing()}, tmp_path / "step-0001.pt")  # an object of a class: not weights only
    with pytest.warns(UserWarning, match="step-0001.pt does not load"):
        assert checkpoints.latest(tmp_path, "step-*.pt") == (None, None)
