"""amp O2 under core_ops' DistributedDataParallel on 2 gloo ranks: the ranks stay
identical step for step, and an overflow on one rank skips the step on both (the
allreduce carries the inf) and halves both scales."""

from _launch import run_ranks
from amp_ddp_workers import OVERFLOW_STEP


def test_o2_with_ddp_stays_in_sync_and_skips_together():
    r0, r1 = run_ranks("amp_ddp_workers:o2_with_ddp", timeout=120)
    for i, (a, b) in enumerate(zip(r0, r1)):
        assert a["scale"] == b["scale"] == (2.0**15 if i >= OVERFLOW_STEP else 2.0**16)
        for x, y in zip(a["params"] + a["masters"], b["params"] + b["masters"]):
            assert x.equal(y), f"ranks differ after step {i}"
    before, skipped = r0[OVERFLOW_STEP - 1], r0[OVERFLOW_STEP]
    assert all(x.equal(y) for x, y in zip(before["masters"], skipped["masters"]))
    assert not r0[OVERFLOW_STEP + 1]["masters"][0].equal(skipped["masters"][0])
    assert r0[0]["params"][0].dtype.is_floating_point and r0[0]["params"][0].itemsize == 2
