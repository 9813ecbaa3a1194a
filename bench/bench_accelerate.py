"""What the Accelerate plugin costs, in the same run, medians of per-step times:

    python bench/bench_accelerate.py [--repeats 5] [--steps 40]

  O2 step           accelerator.backward + optimizer.step under ApexPlugin("O2") against
                    the same model and batches in a hand-written core_ops.amp O2 loop
                    (amp.initialize + scale_loss + step), one process   target <= 1.05 x
  O0, 2 ranks       the same step under ApexPlugin("O0") (core_ops' DDP) against
                    Accelerate's fp32 with torch's DDP, 2 gloo processes x 1 thread
                                                                        target <= 1.0 x

A step is forward, loss, backward, optimizer step, zero_grad. The runs alternate and the
ratio is the median over the alternations of each pair's ratio of median step times
(bench_lightning.paired); the first 5 steps of each run are warm-up. The 2-rank case
runs under ``accelerate launch`` (started here with ACCELERATE_USE_CPU=1).
"""

import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator

import harness
from bench_lightning import WARMUP, batches, conv_net, hand_written_o2, mlp, paired
from core_ops_accelerate import ApexPlugin


def accelerate_run(net, data, plugin=None):
    accelerator = Accelerator(kwargs_handlers=[plugin] if plugin else None)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    model, opt = accelerator.prepare(net, opt)
    times = []
    for x, y in data:
        t0 = time.perf_counter()
        accelerator.backward(F.cross_entropy(model(x), y))
        opt.step()
        opt.zero_grad()
        times.append((time.perf_counter() - t0) * 1e3)
    return times[WARMUP:], accelerator


def case_o2(args):
    data = batches(args.steps, (3, 8, 8), 32)
    runs = []
    for _ in range(args.repeats):
        runs.append((hand_written_o2(conv_net(), data), accelerate_run(conv_net(), data, ApexPlugin(opt_level="O2"))[0]))
    return paired(runs, "O2 step", "hand-written amp O2 loop", 1.05)


def case_ddp(args):
    data = batches(args.steps, (512,), 32)
    runs, rank = [], 0
    for _ in range(args.repeats):
        theirs, accelerator = accelerate_run(mlp(), data)
        ours, _ = accelerate_run(mlp(), data, ApexPlugin(opt_level="O0"))
        runs.append((theirs, ours))
        rank = accelerator.process_index
    if rank == 0:
        harness.emit_row(paired(runs, "O0, 2 ranks", "fp32 + torch DDP", 1.0))


def main():
    launch = [str(Path(sys.executable).with_name("accelerate")), "launch", "--multi_gpu", "--num_processes", "2"]
    harness.framework_main(__doc__, case_o2, case_ddp, launch, dict(ACCELERATE_USE_CPU="1"), "O0, 2 ranks",
                           "fp32 + torch DDP", WARMUP)


if __name__ == "__main__":
    main()
