"""FusedAdam vs torch.optim.AdamW(fused=True), the strongest PyTorch baseline, in the
same run (interleaved), plus the whole mixed-precision step against the torch idiom.

    python bench/bench_adam.py [--device cpu|cuda] [--repeats 20] [--numel 20000000]

Cases (targets on CPU, from the fused-optimizer issue):
  fp32, 200 tensors                         <= 1.0 x torch fused AdamW
  fp32, 2000 tensors                        <= 0.8 x
  bf16 params, fp32 state                   <= 0.85 x torch fused AdamW on the bf16 params
  bf16 params + fp32 master weights         <= 1.1 x torch fused AdamW on fp32 params
  mixed-precision step: unscale + inf check + clip + AdamW, one call
                                            <= 0.6 x GradScaler.unscale_ + clip_grad_norm_
                                                 (foreach) + scaler.step(AdamW fused) + update
  GradScaler.step, fp32 (both write the unscaled grads back)
                                            <= 1.0 x the same with AdamW(fused=True)
  the grad write-back's cost: FusedAdam.step(grad_scale=s) against FusedAdam.step(),
  no target (Note [Grads written back unscaled])
Each case first checks that both sides compute the same update.
"""

import torch
from torch.testing import assert_close

import harness
from core_ops.optimizers import FusedAdam

HYPER = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def make(numel, count, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    sizes = [numel // count + (i < numel % count) for i in range(count)]
    return [torch.randn(n, generator=g).to(device=device, dtype=dtype).requires_grad_() for n in sizes]


def with_grads(params, seed=1):
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = (torch.randn(p.shape, generator=g) * 1e-2).to(device=p.device, dtype=p.dtype)
    return params


def twin(numel, count, dtype, device, baseline_dtype=None):
    ours = with_grads(make(numel, count, dtype, device))
    theirs = with_grads([p.detach().clone().to(baseline_dtype or dtype).requires_grad_() for p in ours])
    return ours, theirs


def check(ours, theirs, o_opt, t_opt, tol):
    o_opt.step(), t_opt.step()
    for a, b in zip(ours, theirs):
        assert_close(a.detach().float(), b.detach().float(), **tol)


def case_plain(args, count, dtype, master=False, baseline_dtype=None):
    ours, theirs = twin(args.numel, count, dtype, args.device, baseline_dtype)
    o = FusedAdam(ours, master_weights=master, **HYPER)
    t = torch.optim.AdamW(theirs, fused=True, **HYPER)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 or master else dict(rtol=1e-2, atol=1e-3)
    if baseline_dtype is None or baseline_dtype == dtype:
        check(ours, theirs, o, t, tol)
    return t.step, o.step, None


class TorchIdiom:
    """The torch way: GradScaler.unscale_ (unscale + inf check), clip_grad_norm_
    (foreach), scaler.step(AdamW fused) and scaler.update()."""

    def __init__(self, params, device):
        self.params = params
        self.opt = torch.optim.AdamW(params, fused=True, **HYPER)
        self.scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 10, growth_interval=10 ** 9)
        self.scaler.scale(torch.ones((), device=device))  # creates its scale tensor, as a loss would
        self.grads = [p.grad.clone() for p in params]

    def refresh(self):
        """Scaled grads as backward leaves them (unscale_ overwrote them); untimed."""
        torch._foreach_copy_([p.grad for p in self.params], self.grads)

    def __call__(self):
        self.scaler.unscale_(self.opt)
        torch.nn.utils.clip_grad_norm_(self.params, 1.0, foreach=True)
        self.scaler.step(self.opt)
        self.scaler.update()


class CoreOpsStep:
    """The core_ops way: one norm pass over the scaled grads, one fused update that
    unscales, clips, skips on overflow; the loss scale updated on the device."""

    def __init__(self, params, device):
        import core_ops
        self.core_ops = core_ops
        self.params = params
        self.opt = FusedAdam(params, **HYPER)
        self.scale = torch.full((1,), 2.0 ** 10, device=device)
        self.tracker = torch.zeros(1, dtype=torch.int32, device=device)

    def __call__(self):
        found_inf = torch.zeros(1, device=self.scale.device)
        self.opt.step(grad_scale=self.scale, found_inf=found_inf, max_grad_norm=1.0)
        self.core_ops.update_scale(self.scale, self.tracker, found_inf, growth_interval=10 ** 9)


def scaled_grads(params_lists):
    """Scales every grad by 2^10, as a scaled loss leaves them, and returns the untimed
    refresh that puts them back before each call (the steps unscale them in place)."""
    params = [p for ps in params_lists for p in ps]
    for p in params:
        p.grad.mul_(2.0 ** 10)
    saved = [p.grad.clone() for p in params]
    return lambda: torch._foreach_copy_([p.grad for p in params], saved)


def case_mixed_step(args):
    ours, theirs = twin(args.numel, args.tensors, torch.float32, args.device)
    refresh = scaled_grads([ours, theirs])
    base, core = TorchIdiom(theirs, args.device), CoreOpsStep(ours, args.device)
    base(), core()
    for a, b in zip(ours, theirs):
        assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)
    return base, core, refresh


def scaler_step(opt, device):
    scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 10, growth_interval=10 ** 9)
    scaler.scale(torch.ones((), device=device))  # creates its scale tensor, as a loss would

    def step():
        scaler.step(opt)
        scaler.update()
    return step


def case_grad_scaler(args):
    ours, theirs = twin(args.numel, args.tensors, torch.float32, args.device)
    refresh = scaled_grads([ours, theirs])
    base = scaler_step(torch.optim.AdamW(theirs, fused=True, **HYPER), args.device)
    core = scaler_step(FusedAdam(ours, **HYPER), args.device)
    base(), core()
    for a, b in zip(ours, theirs):
        assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)
        assert_close(a.grad, b.grad, rtol=0, atol=0)  # both wrote the unscaled grads back
    return base, core, refresh


def case_write_back(args):
    params = with_grads(make(args.numel, args.tensors, torch.float32, args.device))
    refresh = scaled_grads([params])
    opt, scale = FusedAdam(params, **HYPER), torch.full((1,), 2.0 ** 10, device=args.device)
    return opt.step, lambda: opt.step(grad_scale=scale), refresh


def main():
    args = harness.parser(__doc__.splitlines()[0], repeats=20).parse_args()
    harness.setup(args)
    print(f"{args.numel:,} params on {args.device}, {args.repeats} interleaved repeats, "
          f"{torch.get_num_threads()} threads\n")
    cases = [
        ("fp32, 200 tensors", "AdamW(fused=True) fp32", lambda: case_plain(args, 200, torch.float32), 1.0),
        ("fp32, 2000 tensors", "AdamW(fused=True) fp32", lambda: case_plain(args, 2000, torch.float32), 0.8),
        ("bf16 params, fp32 state", "AdamW(fused=True) bf16",
         lambda: case_plain(args, args.tensors, torch.bfloat16), 0.85),
        ("bf16 + fp32 masters", "AdamW(fused=True) fp32",
         lambda: case_plain(args, args.tensors, torch.bfloat16, master=True, baseline_dtype=torch.float32), 1.1),
        ("mixed-precision step", "unscale_+clip_grad_norm_+step+update",
         lambda: case_mixed_step(args), 0.6),
        ("GradScaler.step, fp32", "GradScaler.step(AdamW(fused=True))", lambda: case_grad_scaler(args), 1.0),
        ("grad write-back, fp32", "FusedAdam.step() (no scale)", lambda: case_write_back(args), None),
    ]
    # Bytes a step must move per element (read + write): the plain cases' share of copy.
    moved = {"fp32, 200 tensors": 28, "fp32, 2000 tensors": 28,  # p, m, v read + written, g read
             "bf16 params, fp32 state": 22,                      # p 2+2, g 2, m and v 16
             "bf16 + fp32 masters": 28}                          # master 8, m, v 16, g 2, p written 2
    rows = []
    for label, base_name, make_case, target in cases:
        base, core, before = make_case()
        bt, ct = harness.time_ab(base, core, args.device, args.repeats, args.warmup, before)
        rows.append(harness.row(label, base_name, bt, ct, target))
        del base, core
    harness.compare(rows)
    copy_gbps = harness.copy_bandwidth(args.device)
    print(f"\ncopy bandwidth (read + write): {copy_gbps:.1f} GB/s")
    for r in rows:
        if r["case"] in moved:
            gbps = harness.gbps(moved[r["case"]] * args.numel, r["core_ops_ms"])
            print(f"{r['case']}: FusedAdam moves {gbps:.1f} GB/s, {100 * gbps / copy_gbps:.0f}% of copy")
    if args.plot:
        harness.plot(rows, args.plot, f"FusedAdam, {args.numel:,} params, {args.device}")
    if args.json:
        harness.write_json(args.json, rows, args=vars(args))
    failed = [r["case"] for r in rows if r["passed"] is False]
    if failed:
        print(f"\nmissed target: {', '.join(failed)}")


if __name__ == "__main__":
    main()
