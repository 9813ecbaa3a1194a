"""torch.compile'd training steps: the demo's transformer (plugins/lightning/examples/
char_lm.py) at O2-bf16 with FusedAdam and FusedRMSNorm, compiled, against the compiled
torch idiom (float32 weights, torch.autocast(bf16), nn.RMSNorm, AdamW(fused=True)) and
against itself in eager mode, in one run; compiled as a model and a step apart, and as
one graph for the whole step (forward, scale_loss backward, step).

    python bench/bench_compile.py [--device cpu|cuda] [--steps 30] [--width 256] [--layers 4]

Each run trains from the same weights on the same batches, compiling into a fresh
inductor cache; the first step's time (compiling included) is reported, then the runs
take turns step by step and the median of each one's steps after --warmup is. Targets
(issue 35): compiled O2-bf16 step <= 1.0x the compiled autocast step (CPU), <= 0.9x
(GPU); first compile <= 1.3x the autocast model's.
"""

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F

import char_lm_case
import harness
from core_ops import amp
from core_ops.optimizers import FusedAdam


def o2_run(args, compiled):
    model = char_lm_case.model(args).to(args.device)
    opt = FusedAdam(model.parameters(), lr=1e-3, weight_decay=0.01)
    model, opt = amp.initialize(model, opt, opt_level="O2", half_dtype=torch.bfloat16, verbosity=0)
    forward = torch.compile(model) if compiled else model
    step = torch.compile(opt.step) if compiled else opt.step

    def train_step(x, y):
        loss = F.cross_entropy(forward(x).float().flatten(0, 1), y.flatten())
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        step()
        opt.zero_grad()
        return loss
    return train_step


def o2_one_graph_run(args):
    """The whole O2 train step (forward, scale_loss backward, step) as one graph, with
    dynamo's trace_autograd_ops (docs/compile.md)."""
    model = char_lm_case.model(args).to(args.device)
    opt = FusedAdam(model.parameters(), lr=1e-3, weight_decay=0.01)
    model, opt = amp.initialize(model, opt, opt_level="O2", half_dtype=torch.bfloat16, verbosity=0)

    @torch.compile(fullgraph=True)
    def whole(x, y):
        loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
        return loss.detach()

    def train_step(x, y):
        with torch._dynamo.config.patch(trace_autograd_ops=True):
            loss = whole(x, y)
        opt.zero_grad()
        return loss
    return train_step


def autocast_run(args):
    model = char_lm_case.model(args, fused=False).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, fused=True)
    forward = torch.compile(model)

    def train_step(x, y):
        with torch.autocast(torch.device(args.device).type, dtype=torch.bfloat16):
            loss = F.cross_entropy(forward(x).float().flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    return train_step


def first_step(train_step, batch, device):
    """The first call (compiling included), in ms."""
    harness.sync(device)
    t0 = time.perf_counter()
    train_step(*batch)
    harness.sync(device)
    return (time.perf_counter() - t0) * 1e3


def interleaved(steps, data, device):
    """Each run's step times, the runs taking turns step by step (ABCD ABCD ...), so
    that a busy spell of the machine hits every run alike; and each run's losses."""
    times, losses = [[] for _ in steps], [[] for _ in steps]
    for x, y in data:
        for i, step in enumerate(steps):
            harness.sync(device)
            t0 = time.perf_counter()
            losses[i].append(float(step(x, y)))
            harness.sync(device)
            times[i].append((time.perf_counter() - t0) * 1e3)
    return times, losses


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    char_lm_case.add_size_args(p)
    args = p.parse_args()
    data = char_lm_case.batches(args.steps, args.batch, args.seq, args.device)
    # Inductor's one-time start-up (imports, its compile workers) is paid here, not by
    # whichever run comes first.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench_compile_")
    torch.compile(lambda t: (t * 2).sum())(torch.ones(8, device=args.device))
    # The whole-step graph is compiled last and every run takes a second step before the
    # next is made: torch 2.14's dynamo fails a compile that follows one of a backward
    # traced with trace_autograd_ops (tools/upstream/dynamo_stale_frame_after_backward.py).
    runs = (("compiled autocast(bf16) + AdamW(fused=True)", lambda: autocast_run(args)),
            ("compiled O2-bf16 + FusedAdam", lambda: o2_run(args, True)),
            ("eager O2-bf16 + FusedAdam", lambda: o2_run(args, False)),
            ("compiled O2-bf16 + FusedAdam, the whole step one graph", lambda: o2_one_graph_run(args)))
    if not hasattr(torch._dynamo.config, "trace_autograd_ops"):  # from torch 2.11
        print(f"  torch {torch.__version__}: dynamo cannot trace a backward (no trace_autograd_ops), "
              "so no whole-step graph", flush=True)
        runs = runs[:-1]
    steps, firsts = [], []
    for name, make in runs:
        # A cold compile each: inductor's on-disk caches would otherwise serve a rerun.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench_compile_")
        steps.append(make())
        firsts.append(first_step(steps[-1], data[0], args.device))
        first_step(steps[-1], data[1], args.device)  # and any recompile of the second call
        print(f"  {name}: first step {firsts[-1] / 1e3:.1f} s", flush=True)
    times, losses = interleaved(steps, data[2:], args.device)
    rows = [(name, first, statistics.median(t[args.warmup:]), loss[-1])
            for (name, _), first, t, loss in zip(runs, firsts, times, losses)]
    base_first, base = rows[0][1], rows[0][2]
    print(f"\n{harness.machine()['cpu'] if args.device == 'cpu' else harness.machine()['gpu']}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.layers} layers of width "
          f"{args.width}, {args.batch} x {args.seq} tokens a step, runs taking turns, median of steps {args.warmup + 3}-{args.steps}\n")
    print("| run | first step s (compile) | step ms | vs compiled autocast | loss at the last step |")
    print("|---|---:|---:|---:|---:|")
    for name, first, median, loss in rows:
        print(f"| {name} | {first / 1e3:.1f} | {median:.1f} | {median / base:.2f}x | {loss:.3f} |")
    print(f"\nfirst compile, O2 over autocast: {rows[1][1] / base_first:.2f}x (target <= 1.3x); "
          f"compiled O2 over eager O2: {rows[1][2] / rows[2][2]:.2f}x, one graph over eager O2: "
          f"{rows[3][2] / rows[2][2]:.2f}x")


if __name__ == "__main__":
    main()
