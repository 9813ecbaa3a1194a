"""FusedAdam with compact state on 2 gloo ranks (one launch for all of it): under
core_ops' DistributedDataParallel and FSDP2's fully_shard, remainders step as fp32
masters (params bit for bit after every step), 8-bit moments with remainders train
close to them, every rank holds the same model, and a run resumed from each rank's
saved state is the straight run, bit for bit; under FSDP2 also through
torch.distributed.checkpoint. Under FSDP2 the blocks of 8-bit moments are
taken over each rank's local shard (state tensors are DTensors laid out as the params,
the block maxima each rank's own)."""

import torch
from _launch import run_ranks


def test_compact_state_under_ddp_and_fsdp2():
    results = run_ranks("compact_state_workers:both", timeout=240)
    for kind in ("ddp", "fsdp"):
        for rank, result in enumerate(results):
            r = result[kind]
            compact = r["compact"]["layout"]
            assert compact["master_remainder"] == [("torch.int16", "DTensor" if kind == "fsdp" else "Tensor")]
            assert ("torch.uint8", "DTensor" if kind == "fsdp" else "Tensor") in compact["exp_avg"]
            # Note [Block maxima of shards]: under FSDP2 a DTensor of every rank's own maxima
            assert compact["exp_avg_absmax"] == [("torch.float32", "DTensor" if kind == "fsdp" else "Tensor")]
            # the straight runs and the resumed ones, bit for bit
            assert torch.equal(torch.cat([p.flatten() for p in r["compact"]["seen"][-1]]),
                               torch.cat([p.flatten() for p in r["compact"]["resumed"]])), (kind, rank)
            assert torch.equal(torch.cat([p.flatten() for p in r["masters"]["seen"][-1]]),
                               torch.cat([p.flatten() for p in r["masters"]["resumed"]])), (kind, rank)
            for a, b in zip(r["masters"]["seen"], r["remainders"]["seen"]):
                assert all(torch.equal(x, y) for x, y in zip(a, b)), (kind, rank)
            # every rank the same model
            for a, b in zip(r["compact"]["seen"][-1], results[0][kind]["compact"]["seen"][-1]):
                assert torch.equal(a, b), (kind, rank)
            if kind == "fsdp":  # saved and loaded by torch.distributed.checkpoint
                for a, b in zip(r["dcp"]["straight"], r["dcp"]["resumed"]):
                    assert torch.equal(a, b), rank
        # 8-bit moments move the params off the fp32-state run, but not far (8 steps, lr 1e-2)
        masters = torch.cat([p.flatten().float() for p in results[0][kind]["masters"]["seen"][-1]])
        compact = torch.cat([p.flatten().float() for p in results[0][kind]["compact"]["seen"][-1]])
        start = torch.cat([p.flatten().float() for p in results[0][kind]["masters"]["seen"][0]])
        assert (compact - masters).norm() <= 0.1 * (masters - start).norm(), kind
