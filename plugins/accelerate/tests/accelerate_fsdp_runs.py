"""ApexPlugin with Accelerate's FSDP2 (``FullyShardedDataParallelPlugin(fsdp_version=2)``)
on 2 (or 4) gloo processes, against the same training on multi-CPU data parallelism:

    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 accelerate_fsdp_runs.py OUT

Accelerate enters FSDP only from GPU kinds of distributed run (AcceleratorState turns
MULTI_GPU, not MULTI_CPU, into FSDP), so on a CPU machine this script makes the one
change Accelerate's launcher would have made on GPUs: after the data-parallel run it
sets the distributed type to FSDP (in the process state and the accelerator state)
with the FSDP2 plugin.
Everything after it is Accelerate's own FSDP2 preparation (``fully_shard`` by its
auto-wrap policy, the optimizers moved onto the shards) and the plugin. Each rank saves
OUT/fsdp-rank<r>.pt for test_accelerate_fsdp.py (4 processes: the bf16 comparison alone,
OUT/fsdp4-rank<r>.pt).
"""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
from torch import nn

from core_ops.optimizers import FusedAdam
from core_ops_accelerate import ApexPlugin

sys.path.insert(0, str(Path(__file__).parents[3] / "tests" / "support"))
from teardown import leave_process_group  # noqa: E402
from small_task import Block  # noqa: E402

STEPS = 6


def batches(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(4, 16, generator=g), torch.randn(4, 5, generator=g)) for _ in range(STEPS)]


def offload_of(module):
    """{(each FSDP2 unit's offload policy, whether FSDP2 keeps each of its params on the
    CPU)}, from torch's private FSDP2 state: what fully_shard was given."""
    groups = [m._get_fsdp_state()._fsdp_param_group for m in module.modules() if hasattr(m, "_get_fsdp_state")]
    return sorted({(type(g.offload_policy).__name__, all(fp.offload_to_cpu for fp in g.fsdp_params))
                   for g in groups if g is not None})


def _whole(p):
    return p.full_tensor().detach() if hasattr(p, "full_tensor") else p.detach().clone()


def run(acc, data, record=True, inf_at=None, prepared=None):
    model, opt = prepared or acc.prepare(*_prepared())
    history = []
    for i, (x, y) in enumerate(data):
        loss = F.mse_loss(model(x).float(), y)
        if inf_at == (i, acc.process_index):
            loss = loss * float("inf")
        acc.backward(loss)
        norm = acc.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        opt.zero_grad()
        if record:
            history.append(dict(loss=loss.detach(), norm=torch.as_tensor(norm).detach().float(),
                                skipped=opt.step_was_skipped, scale=acc.core_ops_apex.loss_scale_value,
                                params=torch.cat([_whole(p).float().reshape(-1) for p in model.parameters()])))
    return model, opt, history


def _fsdp(apex, fsdp_plugin):
    acc = Accelerator(kwargs_handlers=[apex])
    # See the docstring. Every AcceleratorState() (Accelerate makes one per wrapped
    # optimizer) copies the process state's fields over its own, so both are set.
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    acc.state.distributed_type, acc.state.fsdp_plugin = DistributedType.FSDP, fsdp_plugin
    return acc


def _prepared():
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block(), nn.Linear(16, 5))
    return model, FusedAdam(model.parameters(), lr=1e-2)


def main():
    out = Path(sys.argv[1])
    results = {}
    plugin = lambda: ApexPlugin(opt_level="O2", half_dtype="bf16", allreduce_always_fp32=True)  # noqa: E731
    acc = Accelerator(kwargs_handlers=[plugin()])
    rank = results["rank"] = acc.process_index
    data = batches(rank)
    _, _, results["ddp"] = run(acc, data)

    fsdp_plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                                 transformer_cls_names_to_wrap=["Block"])
    acc = _fsdp(plugin(), fsdp_plugin)
    model, opt, results["fsdp"] = run(acc, data)
    results["fsdp_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
    results["fsdp_types"] = sorted({type(p).__name__ for p in model.parameters()})
    results["fsdp_local"] = sum(p.to_local().numel() for p in model.parameters())
    results["whole"] = sum(p.numel() for p in model.parameters())
    if acc.num_processes != 2:  # 4 processes: the comparison alone
        torch.save(results, out / f"fsdp{acc.num_processes}-rank{rank}.pt")
        return
    # FSDP2's CPU offload: the bf16 run above with the plugin's cpu_offload. Accelerate
    # turns cpu_offload=True into CPUOffloadPolicy(), which pins the shards, and pinning
    # needs a CUDA driver ("Found no NVIDIA driver" in fully_shard): here, the policy
    # unpinned.
    from torch.distributed.fsdp import CPUOffloadPolicy
    offload_plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                                    transformer_cls_names_to_wrap=["Block"],
                                                    cpu_offload=CPUOffloadPolicy(pin_memory=False))
    offloaded, offload_opt, results["offload"] = run(_fsdp(plugin(), offload_plugin), data)
    results["offload_of"] = offload_of(offloaded)
    results["offload_optimizer"] = type(offload_opt.optimizer).__name__
    results["offload_state_devices"] = sorted({str(v.to_local().device if hasattr(v, "to_local") else v.device)
                                               for s in offload_opt.optimizer.state.values() for v in s.values()})
    # fp16 (dynamic loss scale), rank 1's loss inf at step 2; then stopped after 3 steps,
    # save_state, a fresh model and optimizer load_state-d, 3 steps: as the straight run.
    fp16 = lambda: ApexPlugin(opt_level="O2", half_dtype="fp16")  # noqa: E731
    _, _, results["fp16"] = run(_fsdp(fp16(), fsdp_plugin), data, inf_at=(2, 1))
    _, _, results["fp16_straight"] = run(_fsdp(fp16(), fsdp_plugin), data)
    acc = _fsdp(fp16(), fsdp_plugin)
    first = acc.prepare(*_prepared())
    run(acc, data[:3], prepared=first)
    acc.save_state(str(out / "state"))
    acc = _fsdp(fp16(), fsdp_plugin)
    resumed = acc.prepare(*_prepared())
    acc.load_state(str(out / "state"))
    _, _, results["resumed"] = run(acc, data[3:], prepared=resumed)
    results["fsdp_units"] = sorted({type(m).__name__ for m in model.modules() if type(m).__name__.startswith("FSDP")})
    results["fsdp_param_dtypes"] = sorted({str(m._get_fsdp_state()._mp_policy.param_dtype) for m in model.modules()
                                           if hasattr(m, "_get_fsdp_state")})
    torch.save(results, out / f"fsdp-rank{rank}.pt")


if __name__ == "__main__":
    main()
    leave_process_group()
