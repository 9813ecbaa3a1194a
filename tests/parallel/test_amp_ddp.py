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


def test_o2_masters_follow_the_broadcast_of_either_ddp():
    """Ranks seeded apart: after core_ops' or torch's DistributedDataParallel is built,
    every rank's fp32 masters are rank 0's, bit for bit (rank 0's own float32 weights,
    never rounded through half), and model and masters stay identical at every step
    (Apex's tests/distributed/amp_master_params)."""
    r0, r1 = run_ranks("amp_ddp_workers:o2_ranks_seeded_apart", timeout=180)
    assert set(r0) == {(w, o) for w in ("core_ops", "torch") for o in ("sgd", "fused_adam")}
    for case, a in r0.items():
        b = r1[case]
        assert not all(x.equal(y) for x, y in zip(a["fp32"], b["fp32"])), "ranks were seeded alike"
        params, masters = a["steps"][0]  # masters: the optimizer's params, BatchNorm's included
        assert [p.dtype for p in params].count(torch.float16) == 6 and len(masters) == len(params) == 8
        assert all(m.dtype == torch.float32 and m.equal(w) for m, w in zip(masters, a["fp32"])), \
            f"{case}: rank 0's masters are not its float32 weights"
        for step, ((pa, ma), (pb, mb)) in enumerate(zip(a["steps"], b["steps"])):
            for x, y in zip(pa + ma, pb + mb):
                assert x.equal(y), f"{case}: ranks differ after step {step}"
        assert not a["steps"][-1][1][0].equal(masters[0])  # it trained
