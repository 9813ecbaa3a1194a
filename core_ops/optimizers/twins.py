"""The core_ops twin of a torch.optim optimizer: the same params, param groups (their
hyperparameters, and keys such as an LR scheduler's ``initial_lr``) and state, stepped
by one fused kernel call per (device, dtype) group. What the Accelerate plugin's
``fused_optimizer=True`` swaps in."""

import functools

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


def wants_twin(optimizer, fused_optimizer, properties):
    """Whether a plugin steps ``optimizer`` through its twin: ``fused_optimizer`` True,
    or left unset (None) while ``master_weights="remainder"`` (``properties``, the amp
    Properties) needs FusedAdam and the twin is one: the setting takes effect instead of
    asking the user to change the script (Note [One declaration per setting])."""
    if fused_optimizer is not None:
        return fused_optimizer
    return properties.remainders and TWINS.get(type(optimizer), (None,))[0] is FusedAdam


def point_scheduler_at(scheduler, twin):
    """Makes an LR ``scheduler`` drive ``twin`` (its optimizer's twin) from now on.

    torch's LR schedulers check that ``optimizer.step()`` ran before their ``step()``
    through a mark that their constructor's wrapper of ``optimizer.step`` sets; the twin
    was never wrapped, so it would warn ("Seems like `optimizer.step()` has been
    overridden") every run. Its step gets the same mark."""
    scheduler.optimizer = twin
    if hasattr(twin.step, "_wrapped_by_lr_sched"):
        return
    step = twin.step

    @functools.wraps(step)
    def marked_step(*args, **kwargs):
        twin._opt_called = True
        return step(*args, **kwargs)

    marked_step._wrapped_by_lr_sched = True
    twin.step = marked_step
