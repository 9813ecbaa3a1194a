"""What Apex's optimizer wrappers (the two FP16_Optimizers) forward to the optimizer
they wrap, so that LR schedulers' and scripts' reads and writes reach it."""


class ForwardsToOptimizer:
    """``state`` and ``param_groups`` are those of ``self.optimizer``."""

    @property
    def state(self):
        return self.optimizer.state

    @state.setter
    def state(self, value):
        self.optimizer.state = value

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value):
        self.optimizer.param_groups = value
