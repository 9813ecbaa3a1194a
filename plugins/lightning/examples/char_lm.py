"""core-ops' demo: a small decoder-only transformer (RMSNorm, causal attention) learns to
write Python, one byte at a time, from the standard library's own source, under
Lightning. The same model and the same batches train five ways, each a real
``Trainer.fit`` on the same strategy class (DDP, 2 CPU processes or one per GPU):

    apex-O2 + apex-ddp   core-ops: bf16 on a CPU / fp16 on a GPU weights, fp32 masters,
                         FusedAdam, FusedRMSNorm, core_ops' bucketed allreduce
    apex-O2-bf16 + 8-bit Adam + apex-ddp
                         the same with bf16 weights, their fp32 masters kept as int16
                         remainders and 8-bit Adam moments: 6 bytes a param, not 14
    32-true + ddp        plain Lightning in float32, AdamW(fused=True), nn.RMSNorm
    bf16-mixed + ddp     plain Lightning's autocast (16-mixed on a GPU), the same
    apex-O0 + apex-ddp   core-ops in float32 (the strategy alone)

and ends with one table: tokens per second (the steps after the first few, so neither
the kernel build nor warm-up counts), the bytes the weights and the optimizer keep
(params, masters, optimizer state), peak memory, and the final loss.

    python plugins/lightning/examples/char_lm.py [--steps 60] [--devices 2] [--plot out.png]
"""

import argparse
import glob
import os
import sysconfig
import time
import warnings

warnings.filterwarnings("ignore", ".*LeafSpec.*")  # Lightning 2.6's own, on torch 2.14

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

WARMUP = 5  # steps left out of the throughput (first calls, kernel loading)


def corpus():
    """The standard library's top-level modules as one byte string (about 4.7 MB)."""
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    return b"\n".join(open(f, "rb").read() for f in files)


class Windows(torch.utils.data.Dataset):
    """Random windows of ``seq + 1`` bytes, the same ones for every run (a fixed seed)."""

    def __init__(self, data, seq, count, seed=0):
        self.data, self.seq = torch.frombuffer(bytearray(data), dtype=torch.uint8), seq
        g = torch.Generator().manual_seed(seed)
        self.starts = torch.randint(0, len(self.data) - seq - 1, (count,), generator=g)

    def __len__(self):
        return len(self.starts)

    def __getitem__(self, i):
        w = self.data[self.starts[i]:self.starts[i] + self.seq + 1].long()
        return w[:-1], w[1:]


class Block(nn.Module):
    def __init__(self, width, heads, norm):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = norm(width, eps=1e-6), norm(width, eps=1e-6)
        self.qkv, self.proj = nn.Linear(width, 3 * width, bias=False), nn.Linear(width, width, bias=False)
        self.up, self.down = nn.Linear(width, 4 * width, bias=False), nn.Linear(4 * width, width, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class CharLM(pl.LightningModule):
    def __init__(self, fused, width=256, layers=4, heads=4, seq=128, lr=1e-3, state_dtype=torch.float32):
        super().__init__()
        self.state_dtype = state_dtype
        torch.manual_seed(0)
        if fused:
            from core_ops.normalization import FusedRMSNorm as norm
        else:
            norm = nn.RMSNorm
        self.fused, self.lr = fused, lr
        self.embed, self.pos = nn.Embedding(256, width), nn.Parameter(torch.zeros(seq, width))
        self.blocks = nn.Sequential(*[Block(width, heads, norm) for _ in range(layers)])
        self.norm, self.head = norm(width, eps=1e-6), nn.Linear(width, 256, bias=False)

    def forward(self, x):
        return self.head(self.norm(self.blocks(self.embed(x) + self.pos)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x).float().flatten(0, 1), y.flatten())
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        if self.fused:
            from core_ops.optimizers import FusedAdam
            return FusedAdam(self.parameters(), lr=self.lr, weight_decay=0.01, adam_w_mode=True,
                             state_dtype=self.state_dtype)
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.01, fused=True)


class Meter(pl.Callback):
    """Step times after the warm-up, the losses; one line a run on rank 0: its name as
    it starts, its figures when it ends."""

    def __init__(self, label):
        self.label, self.times, self.losses, self.clock = label, [], [], []

    def on_train_start(self, trainer, module):
        self._start = time.perf_counter()
        if trainer.global_rank == 0:
            print(f"  {self.label:<24}", end="", flush=True)

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        took = time.perf_counter() - self._t0
        if batch_idx >= WARMUP:
            self.times.append(took)
        self.losses.append(float(outputs["loss"]))
        self.clock.append((self.clock[-1] if self.clock else 0.0) + took)  # seconds of training so far

    def on_train_end(self, trainer, module):
        self.kept_mib = kept_bytes(module, trainer.optimizers[0]) / 2**20
        if trainer.global_rank == 0:
            print(f" {len(self.losses)} steps in {time.perf_counter() - self._start:5.1f} s, "
                  f"loss {self.losses[0]:.2f} -> {self.losses[-1]:.2f}", flush=True)


def kept_bytes(module, optimizer):
    """Bytes the weights and the optimizer keep between steps: the model's params, the
    optimizer's (O2's fp32 masters) and its state, each tensor once."""
    seen, total = set(), 0
    tensors = [*module.parameters(), *(p for g in optimizer.param_groups for p in g["params"])]
    tensors += [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim()]
    for t in tensors:
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def peak_mib():
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the process's peak RSS (KiB on Linux)


# apex-O2-bf16 with remainders for masters and FusedAdam's moments in this dtype.
COMPACT = {"apex-O2-bf16+8bit": ("int8", "8-bit Adam"), "apex-O2-bf16+bf16": (torch.bfloat16, "bf16 Adam"),
           "apex-O2-bf16+remainder": (torch.float32, "remainders")}


def run(precision, strategy, args, data):
    """One run; ``precision`` is a Lightning precision name, or one of COMPACT:
    ApexPrecision with master_weights="remainder" and compact FusedAdam moments."""
    gpu = torch.cuda.is_available()
    compact = COMPACT.get(precision)
    label = f"{f'apex-O2-bf16 + {compact[1]}' if compact else precision} + {strategy}"
    plugins = []
    if compact:
        from core_ops_lightning import ApexPrecision
        precision, plugins = None, [ApexPrecision("O2", half_dtype=torch.bfloat16, master_weights="remainder")]
    meter = Meter(label)
    trainer = pl.Trainer(precision=precision, plugins=plugins, strategy=strategy, accelerator="gpu" if gpu else "cpu",
                         devices=min(args.devices, torch.cuda.device_count()) if gpu else args.devices,
                         max_steps=args.steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[meter], log_every_n_steps=10)
    model = CharLM(fused=compact is not None or precision.startswith("apex"), seq=args.seq,
                   state_dtype=compact[0] if compact else torch.float32)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    loader = torch.utils.data.DataLoader(Windows(data, args.seq, args.steps * args.batch_size * trainer.world_size),
                                         batch_size=args.batch_size, shuffle=False)
    trainer.fit(model, loader)
    step = sorted(meter.times)[len(meter.times) // 2]  # the median step
    tokens = args.batch_size * args.seq * trainer.world_size
    return dict(run=label, tokens_per_s=tokens / step, peak_mib=peak_mib(), kept_mib=meter.kept_mib,
                rank=trainer.global_rank,
                loss=sum(meter.losses[-10:]) / len(meter.losses[-10:]), losses=meter.losses, clock=meter.clock,
                world=trainer.world_size)


def table(results):
    base = {r["run"].split(" + ")[0]: r for r in results}
    rows = ["| run | tokens/s | vs 32-true | weights + optimizer MiB | peak MiB (rank 0) | final loss (last 10 steps) |",
            "|---|---:|---:|---:|---:|---:|"]
    for r in results:
        ratio = r["tokens_per_s"] / base["32-true"]["tokens_per_s"] if "32-true" in base else float("nan")
        rows.append(f"| {r['run']} | {r['tokens_per_s']:.0f} | {ratio:.2f}x | {r['kept_mib']:.1f} | {r['peak_mib']:.0f} "
                    f"| {r['loss']:.3f} |")
    return "\n".join(rows)


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (bars, curves) = plt.subplots(1, 2, figsize=(11, 4))
    names = [r["run"] for r in results]
    bars.barh(names, [r["tokens_per_s"] for r in results], color=[f"C{i}" for i in range(len(results))])
    bars.invert_yaxis()
    bars.set_xlabel("tokens per second (higher is better)")
    for i, r in enumerate(results):  # against time: the same losses, reached sooner or later
        curves.plot(r["clock"], r["losses"], color=f"C{i}", label=r["run"], linewidth=1.2, alpha=0.85)
    curves.set_xlabel("seconds of training (steps only; rank 0)")
    curves.set_ylabel("training loss")
    curves.legend(fontsize=8)
    fig.suptitle("a small byte-level transformer on Python's standard library")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--devices", type=int, default=2, help="processes (CPU) or GPUs")
    p.add_argument("--batch-size", type=int, default=16, help="sequences per process")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--plot", metavar="PNG", help="write throughput bars and loss curves to this file")
    p.add_argument("--runs", help="precision:strategy pairs, comma-separated (default: the five above)")
    args = p.parse_args()
    gpu = torch.cuda.is_available()
    half = "16-mixed" if gpu else "bf16-mixed"
    runs = args.runs or (f"apex-O2{'' if gpu else '-bf16'}:apex-ddp,apex-O2-bf16+8bit:apex-ddp,32-true:ddp,"
                         f"{half}:ddp,apex-O0:apex-ddp")
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.devices))
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    import logging
    for name in ("lightning", "lightning.fabric", "lightning.pytorch"):  # one line a run, then the table
        logging.getLogger(name).setLevel(logging.WARNING)
    data = corpus()
    results = []
    for pair in runs.split(","):
        results.append(run(*pair.split(":"), args, data))
    if results[0]["rank"] != 0:
        return
    print(f"\n{len(data) / 1e6:.1f} MB of Python, {args.steps} steps of {results[0]['world']} x {args.batch_size} "
          f"sequences of {args.seq} bytes; tokens/s from the median step after {WARMUP}\n")
    print(table(results))
    if args.plot:
        plot(results, args.plot)
        print(f"\nplot: {os.path.abspath(args.plot)}")


if __name__ == "__main__":
    main()
