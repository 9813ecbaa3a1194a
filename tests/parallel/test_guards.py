"""The non-finite guards on 2 gloo ranks (guard_workers.py), a bf16 and an fp32 run of
each, the NaN / inf on rank 1 only: the step is skipped on every rank, params and
optimizer state untouched (bit for bit), counted, and training goes on to a finite end."""

import pytest
import torch
from _launch import run_ranks


def _same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("route,runs", [("amp_over_ddp", ("O3", "O0")), ("fused_adam_on_fsdp2", ("bf16", "fp32"))])
def test_a_non_finite_grad_on_one_rank_skips_the_step_on_every_rank(route, runs):
    for rank, result in enumerate(run_ranks(f"guard_workers:{route}", timeout=180)):
        for run in runs:
            r = result[run]
            assert _same(r["before"][0], r["after"][0]), (rank, run, "params moved")
            assert _same(r["before"][1], r["after"][1]), (rank, run, "optimizer state moved")
            assert r["skipped"] == 1 and r["finite"], (rank, run, r["skipped"], r["finite"])
