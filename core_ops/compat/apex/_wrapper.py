"""What Apex's optimizer wrappers (the two FP16_Optimizers) forward to the optimizer
they wrap, so that LR schedulers' and scripts' reads and writes reach it."""


from ..._forwarding import forwarded


class ForwardsToOptimizer:
    """``state`` and ``param_groups`` are those of ``self.optimizer``."""

    state = forwarded("optimizer", "state", settable=True)
    param_groups = forwarded("optimizer", "param_groups", settable=True)
