"""amp O2 under core_ops' DistributedDataParallel on 2 gloo ranks: the ranks stay
identical step for step, and an overflow on one rank skips the step on both (the
allreduce carries the inf) and halves both scales."""

import torch
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


def test_o1_grads_accumulated_across_backwards_are_reduced_once_each():
    # Note [Accumulating under amp]. Tolerances: sums of the same float32 grads in
    # another order (a few ulps).
    r0, r1 = run_ranks("amp_ddp_workers:o1_accumulation_with_ddp", timeout=180)
    for r in (r0, r1):
        for ab, a, b in zip(r["a+b"], r["a"], r["b"]):
            torch.testing.assert_close(ab, a + b, rtol=1e-5, atol=1e-7)  # neither lost nor doubled
        for step, (kept, fresh) in enumerate(zip(r["in_place"], r["fresh"])):
            for x, y in zip(kept, fresh):
                assert torch.equal(x, y), f"grads zeroed in place differ at step {step}"
        ranks = r["no_sync_ranks"]
        assert torch.equal(ranks[0], ranks[1]), "ranks diverged after a no_sync micro-batch"
    # Both micro-batches' grads, each averaged over the ranks (each "expected" part is
    # one synced backward of that micro-batch, the same on every rank).
    expected = r0["no_sync_expected"][0] + r0["no_sync_expected"][1]
    torch.testing.assert_close(r0["no_sync_ranks"][0], expected, rtol=1e-5, atol=1e-7)
