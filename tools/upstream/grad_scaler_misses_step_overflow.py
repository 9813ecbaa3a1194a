"""Reproducer of a torch.amp.GradScaler limitation (torch 2.9 to 2.15), needing torch alone:

    python tools/upstream/grad_scaler_misses_step_overflow.py

An optimizer that unscales inside its own step (``_step_supports_amp_scaling = True``,
as torch's fused Adam) can find an overflow GradScaler's inf check could not: finite
grads whose norm overflows float32 (LAMB's clipping norm, NovoGrad's layer norms). It
skips the step, but cannot tell GradScaler: ``GradScaler.step`` hands it a
``found_inf`` summed afresh for that step and passes no reference to itself, and
``update()`` reads only its own per-device flags. The scale then grows as after a good
step, and every later step overflows the same way. core_ops' workaround:
core_ops/torch_patches/grad_scaler_flags.py. Exit status 1 when the limitation shows.
"""

import sys

import torch


class NormClippingSGD(torch.optim.Optimizer):
    """SGD clipped by the global grad norm, unscaled in its step, as a fused kernel would."""

    _step_supports_amp_scaling = True

    def __init__(self, params, lr=0.1):
        super().__init__(params, dict(lr=lr))

    @torch.no_grad()
    def step(self):
        grads = [p.grad for g in self.param_groups for p in g["params"]]
        unscaled = [g / self.grad_scale for g in grads]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in unscaled]))
        # The step's own overflow check: the norm is inf although every grad is finite.
        self.found_inf.copy_(torch.maximum(self.found_inf, (~torch.isfinite(norm)).float()))
        if self.found_inf.item() == 0:
            for g in self.param_groups:
                for p, u in zip(g["params"], unscaled):
                    p.add_(u, alpha=-g["lr"])


def main():
    param = torch.nn.Parameter(torch.zeros(4))
    opt = NormClippingSGD([param])
    scaler = torch.amp.GradScaler("cpu", init_scale=1.0, growth_interval=1)
    scaler.scale((param * 3e38).sum()).backward()  # grads 3e38: finite, their norm (6e38) is not
    scaler.step(opt)
    scaler.update()
    after = scaler.get_scale()
    print(f"torch {torch.__version__}: the step skipped itself for an overflowing norm; "
          f"GradScaler's scale went 1.0 -> {after}")
    return 1 if after > 1.0 else 0


if __name__ == "__main__":
    sys.exit(main())
