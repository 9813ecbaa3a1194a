"""Reproducer of an FSDP2 limitation (torch 2.9 to 2.15), needing torch alone:

    python tools/upstream/fsdp2_no_policy_setter.py

A module sharded with ``fully_shard(module)`` keeps the default mixed-precision policy
(gather and compute in the params' dtype) and nothing public changes it afterwards:
``FSDPModule`` has setters for resharding, prefetching and reduction, none for
``mp_policy``, and a second ``fully_shard(module, mp_policy=...)`` is refused. So
``amp.initialize`` at O2, handed a model sharded by code it does not own, writes the
policy into FSDP2's private state (core_ops/torch_patches/fsdp_policy_slots.py). Exit
status 1 when the limitation shows.
"""

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard


def main():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # this process alone
    try:
        model = nn.Sequential(nn.Linear(4, 4))
        fully_shard(model)
        setters = [m for m in dir(FSDPModule) if m.startswith("set_") and ("policy" in m or "precision" in m)]
        try:
            fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
            refused = None
        except Exception as e:  # noqa: BLE001 (torch raises an AssertionError)
            refused = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        print(f"torch {torch.__version__}: FSDPModule's policy setters: {setters or 'none'}; "
              f"a second fully_shard with a policy: {refused or 'taken'}")
        return 1 if not setters and refused else 0
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
