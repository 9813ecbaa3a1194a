"""FusedSGD: Apex's constructor, torch.optim.SGD numerics, one fused kernel call per
(device, dtype) group."""

from torch.optim.optimizer import required

from .._schemas import op
from ._base import FusedOptimizer
from .._sharded import elementwise


class FusedSGD(FusedOptimizer):
    """SGD with momentum, dampening, Nesterov and weight decay, as
    ``apex.optimizers.FusedSGD`` (``wd_after_momentum`` applies the decay after the
    momentum update, as Apex). State dicts interoperate with ``torch.optim.SGD``
    (``state['momentum_buffer']``). ``materialize_master_grads`` is accepted for
    Apex compatibility and has no effect: master weights, when asked for with
    ``master_weights=True``, live in the optimizer and need no separate grads. As in
    Apex and torch.optim.SGD, ``lr`` may be left out when every param group gives it."""

    _state_keys = ("momentum_buffer",)

    def __init__(self, params, lr=required, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
                 wd_after_momentum=False, materialize_master_grads=True, set_grad_none=False,
                 master_weights=False, maximize=False, skip_nonfinite=False):
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                        nesterov=nesterov, wd_after_momentum=wd_after_momentum, maximize=maximize)
        super().__init__(params, defaults, set_grad_none=set_grad_none, master_weights=master_weights,
                         skip_nonfinite=skip_nonfinite)

    def _check_group(self, group, where):
        super()._check_group(group, where)
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError(f"{where}nesterov needs momentum > 0 and dampening = 0, got momentum="
                             f"{group['momentum']}, dampening={group['dampening']}")

    def _step_group(self, group, ps, device, grad_scale, found_inf):
        momentum = group["momentum"]
        lr, lr_tensor = self._lr(group, device)
        # A param's first step with momentum sets its buffer to the grad (as
        # torch.optim.SGD); params in that state go in their own call.
        fresh = [p for p in ps if momentum and self.state[p].get("momentum_buffer") is None]
        seen = [p for p in ps if not (momentum and self.state[p].get("momentum_buffer") is None)]
        if fresh and found_inf is not None:
            # A step that may be skipped must leave a buffer that their first real step
            # still reads as a first. Without dampening a zero buffer does: momentum*0
            # + g is g exactly, so they go with the others, with no host read (a
            # compiled step traces as one graph). With dampening it would read as a
            # step taken ((1-dampening)*g), so a skip leaves them without a buffer:
            # its presence is host-side state, hence one host read, made only while
            # some param has no buffer.
            if group["dampening"] == 0:
                fresh, seen = [], ps
            elif found_inf.item():
                fresh = []
        for first, part in ((True, fresh), (False, seen)):
            if not part:
                continue
            bufs = []
            if momentum:
                for p in part:
                    if self.state[p].get("momentum_buffer") is None:
                        self.state[p]["momentum_buffer"] = self._state_zeros(p)
                    bufs.append(self.state[p]["momentum_buffer"])
            masters = self._masters(part)
            elementwise(op("fused_sgd_"), part)(part, [p.grad for p in part], bufs, masters, lr, momentum,
                             group["dampening"], group["weight_decay"], group["nesterov"],
                             group["wd_after_momentum"], first, group["maximize"], lr_tensor,
                             grad_scale, found_inf)
