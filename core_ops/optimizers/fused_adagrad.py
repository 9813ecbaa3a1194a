"""FusedAdagrad: Apex's constructor, torch.optim.Adagrad numerics, one fused kernel
call per (device, dtype) group."""

from .._schemas import op
from ._base import FusedOptimizer
from .._sharded import elementwise


class FusedAdagrad(FusedOptimizer):
    """Adagrad as ``apex.optimizers.FusedAdagrad`` (``adagrad_w_mode=True``: decoupled
    weight decay), plus torch.optim.Adagrad's ``lr_decay`` and
    ``initial_accumulator_value``; state dicts interoperate with ``torch.optim.Adagrad``
    (``state['sum']``, ``state['step']``)."""

    _state_keys = ("sum",)

    def __init__(self, params, lr=1e-2, eps=1e-10, weight_decay=0.0, set_grad_none=True,
                 adagrad_w_mode=False, lr_decay=0.0, initial_accumulator_value=0.0,
                 master_weights=False, maximize=False, skip_nonfinite=False):
        defaults = dict(lr=lr, eps=eps, weight_decay=weight_decay, adagrad_w_mode=adagrad_w_mode,
                        lr_decay=lr_decay, initial_accumulator_value=initial_accumulator_value,
                        maximize=maximize)
        super().__init__(params, defaults, set_grad_none=set_grad_none, master_weights=master_weights,
                         skip_nonfinite=skip_nonfinite)

    def _step_group(self, group, ps, device, grad_scale, found_inf):
        lr, lr_tensor = self._lr(group, device)
        init = group["initial_accumulator_value"]
        (sums,), steps = self._state_lists(group, ps, sum=lambda p: self._state_zeros(p).fill_(init))
        masters = self._masters(ps)
        elementwise(op("fused_adagrad_"), ps)(ps, [p.grad for p in ps], sums, masters, steps, lr, group["lr_decay"],
                             group["eps"], group["weight_decay"], group["adagrad_w_mode"],
                             group["maximize"], lr_tensor, grad_scale, found_inf)
