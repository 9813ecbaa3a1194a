"""Rank functions for test_deepspeed_offload.py: DeepSpeed's ZeRO-Offload (the optimizer
step on the CPU, on fp32 partitions DeepSpeed owns) with core_ops' FusedAdam as the
client optimizer, against the same engine stepping torch.optim.AdamW.

The ranks come from _launch.py (a gloo process group made first); DeepSpeed takes that
group over (``deepspeed.init_distributed`` finds it initialized) on its CPU accelerator.
"""

import os

# Before deepspeed is imported: its accelerator is chosen once, at the first use.
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from core_ops.optimizers import FusedAdam  # noqa: E402

STEPS = 4
LR = 1e-2


def config(stage, bf16):
    """The DeepSpeed config docs/offload.md shows, with a warm-up schedule (the lr
    changes every step, so an optimizer that missed DeepSpeed's writes to its param
    groups would part from AdamW) and clipping (DeepSpeed clips the partition's grads
    before the client's step)."""
    return {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.5,
        "bf16": {"enabled": bf16},
        "zero_optimization": {"stage": stage, "offload_optimizer": {"device": "cpu"}},
        # A client optimizer under offload: DeepSpeed would insist on its own
        # DeepSpeedCPUAdam (a C++ op it compiles at first use) without the first, and
        # refuses an optimizer class outside its list of tested ones without the second.
        "zero_force_ds_cpu_optimizer": False,
        "zero_allow_untested_optimizer": True,
        "scheduler": {"type": "WarmupLR",
                      "params": {"warmup_min_lr": 0.0, "warmup_max_lr": LR, "warmup_num_steps": STEPS}},
    }


def _deepspeed(rank, world):
    """deepspeed, its communication set up on the process group _launch.py made."""
    os.environ.update(LOCAL_RANK=str(rank), RANK=str(rank), WORLD_SIZE=str(world))
    import deepspeed
    # DeepSpeed's CPU backend builds a shared-memory op (a C++ extension: 68 s on this
    # 2-core machine at first use) that serves only inference_all_reduce; marked
    # unavailable, as on a machine without a compiler, ZeRO's collectives are gloo's.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    return deepspeed


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 5))


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(4, 16, generator=g), torch.randn(4, 5, generator=g)


def optimizer(kind, params):
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=LR, weight_decay=0.01)
    # Each rank's partition is one flat tensor of a few thousand elements here, under
    # min_8bit_size's default of 4096; 0 makes "int8" quantize it, as it would a large
    # model's partitions.
    state_dtype = {"fused": torch.float32, "fused-bf16": torch.bfloat16, "fused-int8": "int8"}[kind]
    return FusedAdam(params, lr=LR, weight_decay=0.01, state_dtype=state_dtype, min_8bit_size=0)


def engine(deepspeed, kind, stage, bf16):
    net = model()
    client = optimizer(kind, net.parameters())
    eng, _, _, _ = deepspeed.initialize(model=net, optimizer=client, config=config(stage, bf16))
    return eng, client


def train(eng, rank, steps, start=0):
    losses = []
    for i in range(start, start + steps):
        x, y = batch(i, rank)
        loss = F.mse_loss(eng(x.to(next(eng.module.parameters()).dtype)).float(), y)
        eng.backward(loss)
        eng.step()
        losses.append(loss.detach())
    return torch.stack(losses)


def masters(deepspeed, eng):
    """The whole fp32 params (DeepSpeed's fp32 partitions gathered), in model order."""
    from deepspeed.utils import safe_get_full_fp32_param
    return torch.cat([safe_get_full_fp32_param(p).reshape(-1) for p in eng.module.parameters()])


def what_it_steps(eng, client):
    """What the client optimizer holds: the tensors it has state for (DeepSpeed's
    partitions) and that state's dtypes and bytes."""
    return dict(wrapper=type(eng.optimizer).__name__, client=type(client).__name__,
                stepped=[(str(p.dtype), str(p.device), p.numel()) for p in client.state],
                state={k: str(v.dtype) for s in client.state.values() for k, v in s.items()},
                state_bytes=sum(v.numel() * v.element_size() for s in client.state.values() for v in s.values()
                                if isinstance(v, torch.Tensor) and v.dim() > 0),
                lr=[g["lr"] for g in client.param_groups])


def _runs(rank, world, stage, cases):
    deepspeed = _deepspeed(rank, world)
    out = {"whole": sum(p.numel() for p in model().parameters())}
    for precision, kind in cases:
        eng, client = engine(deepspeed, kind, stage, precision == "bf16")
        out[precision, kind] = dict(losses=train(eng, rank, STEPS), params=masters(deepspeed, eng),
                                    **what_it_steps(eng, client))
        # What DeepSpeed's own accessor of a param's moment gives (it copies its
        # fragments of the client's state into a float32 tensor).
        from deepspeed.utils import safe_get_full_optimizer_state
        out[precision, kind]["ds_exp_avg"] = safe_get_full_optimizer_state(next(eng.module.parameters()), "exp_avg")
    return out, deepspeed


def stage2(rank, world):
    """ZeRO-2 with offload: fp32 and bf16 engines, FusedAdam (fp32, bf16 and 8-bit
    moments) against AdamW; then the 8-bit one stopped after 2 steps, saved with
    engine.save_checkpoint, loaded into a fresh engine and run on: as straight."""
    cases = [("fp32", "adamw"), ("fp32", "fused"), ("bf16", "adamw"), ("bf16", "fused"),
             ("bf16", "fused-bf16"), ("bf16", "fused-int8")]
    out, deepspeed = _runs(rank, world, 2, cases)
    where = os.environ["DS_CHECKPOINT_DIR"]
    eng, _ = engine(deepspeed, "fused-int8", 2, True)
    first = train(eng, rank, 2)
    eng.save_checkpoint(where, tag="half")
    eng, client = engine(deepspeed, "fused-int8", 2, True)
    eng.load_checkpoint(where, tag="half")
    loaded_state = {k: str(v.dtype) for s in client.state.values() for k, v in s.items()}
    rest = train(eng, rank, STEPS - 2, start=2)
    out["resumed"] = dict(losses=torch.cat([first, rest]), params=masters(deepspeed, eng), loaded_state=loaded_state)
    return out


def stage3(rank, world):
    """ZeRO-3 with offload: FusedAdam against AdamW in fp32, and 8-bit moments in bf16."""
    out, _ = _runs(rank, world, 3, [("fp32", "adamw"), ("fp32", "fused"), ("bf16", "fused"),
                                    ("bf16", "fused-int8")])
    return out


def stages(rank, world):
    """Both, in one launch (one process start and one DeepSpeed import for every case)."""
    return {2: stage2(rank, world), 3: stage3(rank, world)}
