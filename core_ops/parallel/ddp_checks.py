"""The argument checks of DistributedDataParallel: what it can wrap, and the errors
its gradient hooks raise."""

from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

# Params owned by a live DistributedDataParallel: wrapping them twice would reduce
# their grads twice per backward.
OWNED = WeakIdKeyDictionary()


def trainable(module):
    """The params of ``module`` that require grad, once each, owned by no wrapper yet."""
    _check_materialized(module)
    _check_dense(module)
    params = list(dict.fromkeys(p for p in module.parameters() if p.requires_grad))
    if not params:
        raise ValueError("module has no parameters that require grad: there is nothing for "
                         "DistributedDataParallel to reduce")
    check_unowned(params)
    return params


def _check_materialized(module):
    """Lazy modules (nn.LazyLinear, ...) have no shapes until their first forward, so
    the ranks cannot agree on a layout or broadcast weights."""
    lazy = [name for name, p in module.named_parameters() if nn.parameter.is_lazy(p)]
    if lazy:
        raise ValueError(
            f"module has uninitialized (lazy) parameters: {', '.join(lazy)}. Run one forward "
            "with a dummy batch of the real input shape before wrapping it in "
            "DistributedDataParallel, so that their shapes are known")


def _check_dense(module):
    """Sparse gradients (nn.Embedding / nn.EmbeddingBag with sparse=True) cannot go
    into a flat dense bucket; the hooks check each grad too (sparse_grad_error)."""
    sparse = [f"{name or 'module'!r} ({type(m).__name__})" for name, m in module.named_modules()
              if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse
              and any(p.requires_grad for p in m.parameters(recurse=False))]
    if sparse:
        raise ValueError(
            f"sparse=True in {', '.join(sparse)}: DistributedDataParallel does not "
            "support sparse gradients; construct it with sparse=False (dense gradients, which "
            "any optimizer but SparseAdam takes) or freeze its weights")


def sparse_grad_error(name, grad):
    return RuntimeError(
        f"DistributedDataParallel: the gradient of parameter {name!r} is sparse "
        f"(layout {grad.layout}); sparse gradients are not supported. Make the module that "
        "produces it dense (nn.Embedding(..., sparse=False)) or freeze the parameter")


def ready_twice_error(name):
    return RuntimeError(
        f"DistributedDataParallel: the gradient of parameter {name!r} grew after its bucket's "
        "allreduce had started in this backward, so what was added would be lost (a parameter "
        "used in several segments checkpointed with torch.utils.checkpoint(..., "
        "use_reentrant=True), each of which runs its own backward). Use "
        "torch.utils.checkpoint(..., use_reentrant=False), or "
        "DistributedDataParallel(..., delay_allreduce=True), which reduces once backward is over")


def check_unowned(params, owner=None):
    """``params`` must not belong to a live DistributedDataParallel other than ``owner``:
    wrapped twice, their grads would be reduced twice per backward."""
    if any(p in OWNED and OWNED[p]() not in (None, owner) for p in params):
        raise ValueError("module (or some of its parameters) is already wrapped in a "
                         "core_ops DistributedDataParallel; wrap it once")
