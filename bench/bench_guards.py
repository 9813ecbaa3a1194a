"""The cost of the non-finite guards on a normal training step (no inf / nan in it):
the demo's transformer (plugins/lightning/examples/char_lm.py) trained one step at a
time with the guard off and on, alternately (harness.time_ab), in one run:

- O3-bf16 under amp: ``skip_nonfinite=True`` (+ ``max_consecutive_skips=50``, the
  plugins' default) against Apex's unchecked O3;
- bf16 weights with FusedAdam and no amp (Lightning's ``bf16-true``):
  ``FusedAdam(skip_nonfinite=True)`` against the plain step.

    python bench/bench_guards.py [--steps 40] [--width 256] [--layers 4]

Target (issue 36): the guard costs <= 2% of the step (ratio <= 1.02).
"""

import argparse

import torch
import torch.nn.functional as F

import char_lm_case
import harness
from core_ops import amp
from core_ops.optimizers import FusedAdam


def data(args):
    return char_lm_case.batches(1, args.batch, args.seq)[0]


def amp_step(args, guarded):
    model = char_lm_case.model(args)
    opt = FusedAdam(model.parameters(), lr=1e-4)
    guard = dict(skip_nonfinite=True, max_consecutive_skips=50) if guarded else {}
    model, opt = amp.initialize(model, opt, opt_level="O3", half_dtype=torch.bfloat16, verbosity=0, **guard)
    x, y = data(args)

    def step():
        loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
        opt.zero_grad()
    return step


def bf16_true_step(args, guarded):
    model = char_lm_case.model(args).to(torch.bfloat16)
    opt = FusedAdam(model.parameters(), lr=1e-4, master_weights=True, skip_nonfinite=guarded)
    x, y = data(args)

    def step():
        F.cross_entropy(model(x).float().flatten(0, 1), y.flatten()).backward()
        opt.step()
        opt.zero_grad()
    return step


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    char_lm_case.add_size_args(p)
    args = p.parse_args()
    rows = []
    for case, make, baseline in (
            ("O3-bf16 step, amp skip_nonfinite + max_consecutive_skips", amp_step, "O3-bf16, unchecked (Apex)"),
            ("bf16 weights, FusedAdam(skip_nonfinite=True), no amp", bf16_true_step, "FusedAdam, unchecked")):
        plain, guarded = make(args, False), make(args, True)
        base, core = harness.time_ab(plain, guarded, repeats=args.steps, warmup=3)
        rows.append(harness.row(case, baseline, base, core, target=1.02))
    m = harness.machine()
    print(f"\n{m['cpu']}, torch {torch.__version__}, {torch.get_num_threads()} threads; {args.layers} layers of "
          f"width {args.width}, {args.batch} x {args.seq} tokens a step, {args.steps} alternated steps each\n")
    harness.compare(rows)


if __name__ == "__main__":
    main()
