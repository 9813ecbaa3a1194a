"""The core_ops twin of a torch.optim optimizer: the same params, param groups (their
hyperparameters, and keys such as an LR scheduler's ``initial_lr``) and state, stepped
by one fused kernel call per (device, dtype) group. What the Accelerate plugin's
``fused_optimizer=True`` swaps in."""

import torch

from .fused_adagrad import FusedAdagrad
from .fused_adam import FusedAdam
from .fused_sgd import FusedSGD

# torch.optim class -> (core_ops class, options the twin needs that torch's groups lack)
TWINS = {
    torch.optim.AdamW: (FusedAdam, dict(adam_w_mode=True)),
    torch.optim.Adam: (FusedAdam, {}),  # adam_w_mode from decoupled_weight_decay (torch >= 2.6)
    torch.optim.SGD: (FusedSGD, {}),
    torch.optim.Adagrad: (FusedAdagrad, {}),
}


def fused_twin(optimizer):
    """The twin of ``optimizer`` (a torch.optim AdamW, Adam, SGD or Adagrad, not a
    subclass), or None when it has none. The original is left as it was; step the twin
    from now on (and point LR schedulers at it)."""
    if type(optimizer) not in TWINS:
        return None
    cls, needed = TWINS[type(optimizer)]
    if any(g.get("differentiable") for g in optimizer.param_groups):
        return None  # a step that autograd records: only torch's kernels do that
    groups = []
    for group in optimizer.param_groups:
        options = dict(needed)
        if cls is FusedAdam:
            options["adam_w_mode"] = bool(group.get("decoupled_weight_decay", needed.get("adam_w_mode", False)))
        groups.append({"params": list(group["params"]), "lr": group["lr"], **options})
    twin = cls(groups)
    # torch's state dict carries every group's hyperparameters and the state; core_ops'
    # optimizers load it (Note in fused_adam.py: their state dicts interoperate).
    twin.load_state_dict(optimizer.state_dict())
    return twin
