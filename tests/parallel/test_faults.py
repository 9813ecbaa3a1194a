"""Faults across ranks end in a clear error within the process group's timeout, never a
hang (each launch is killed past its own timeout, which would fail the test)."""

from _launch import run_ranks


def test_rank_that_never_joins_times_out():
    rank0, _ = run_ranks("fault_workers:never_joins", pg_timeout_s=3, timeout=60)
    assert rank0["error"] is not None and "joined construction" in rank0["error"]
    assert rank0["seconds"] < 30  # the group timeout (3 s) plus connection slack


def test_rank_that_dies_gives_an_error():
    rank0, rank1 = run_ranks("fault_workers:dies", pg_timeout_s=3, timeout=60, expect_fail=True)
    assert rank1 is None  # it exited without a result
    assert rank0["error"] is not None and "joined construction" in rank0["error"]
    assert rank0["seconds"] < 30


def test_mismatched_models_name_the_difference():
    for rank in run_ranks("fault_workers:mismatched", timeout=60):
        msg = rank["error"]
        assert msg is not None and "differs across ranks" in msg
        assert "rank 0: 6 params, 279 elements" in msg and "rank 1: 6 params, 315 elements" in msg


def test_buffers_that_differ_are_named():
    for rank in run_ranks("fault_workers:buffers_differ", timeout=60):
        msg = rank["error"]
        assert msg is not None and "frozen params or buffers" in msg and "rank 1: crc" in msg
