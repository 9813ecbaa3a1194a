"""One entry per fused optimizer: what the generic tests need to know of it, as torch's
``optim_db`` (torch/testing/_internal/common_optim.py) drives torch's optimizer tests.
Every generic test takes its optimizers from here (``cases``), and each that steps is
parametrized by device (``optim_cases.DEVICES``: the CUDA case skips cleanly without a
GPU; FSDP2 runs on gloo on the CPU and over NCCL on a GPU, CUDA graphs on a GPU alone).

To add an optimizer (its op, kernels and class first: core_ops/csrc/README.md):
  1. one ``OptimizerInfo`` in ``OPTIMIZERS`` below: its class, the kwargs of a typical
     run, of one that takes every path of its kernel and of its other variants, the
     torch.optim optimizer that steps as it does (or None), its Apex alias, its
     tolerances (CUDA against CPU, native against reference) with their reasons, and
     for each generic test that does not apply, why not;
  2. its own special cases (its numerics against a formula or torch, options only it
     has) in ``test_fused_<name>.py``.
Nothing else: test_optimizer_registry.py fails until every class in
``core_ops.optimizers`` has an entry, and every generic test below then runs it.

The generic tests, by the key an entry's ``not_applicable`` names them with:
"""

import dataclasses
from types import ModuleType
from typing import Callable

import pytest
import torch

import core_ops.optimizers.fused_adagrad
import core_ops.optimizers.fused_adam
import core_ops.optimizers.fused_lamb
import core_ops.optimizers.fused_novograd
import core_ops.optimizers.fused_sgd
from core_ops.optimizers import (FusedAdagrad, FusedAdam, FusedLAMB, FusedMixedPrecisionLamb, FusedNovoGrad,
                                 FusedSGD)

GENERIC_TESTS = {
    "contract": "test_optimizer_contract.py: what a fused optimizer promises as a torch.optim.Optimizer "
                "(param groups, copies, skipped steps, checks before updates, load hooks, masters)",
    "device_contract": "test_optimizer_device_contract.py: found_inf and grad_scale read on the device, "
                       "masters step as float32 params, each device's kernel against its oracle over 20 steps",
    "float64": "test_optimizer_device_contract.py: steps on float64 params against its oracle",
    "grads_written_back": "test_grads_written_back.py: after a scaled step the grads hold the unscaled values",
    "norm_overflow": "test_optimizer_contract.py: a norm of finite grads that overflows float32 skips the "
                     "step and backs torch's GradScaler off",
    "apex_group_step": "test_optimizer_contract.py: an Apex checkpoint's per-group step count is resumed",
    "apex_attributes": "test_optimizer_contract.py: a checkpoint whose groups lack the options Apex kept as "
                       "attributes (``apex_attributes``) takes them from the constructor",
    "torch_counterpart": "compared with the torch.optim optimizer that takes the same kwargs ("
                         "test_optimizer_contract.py's float64 lr, test_grads_written_back.py)",
    "skip_nonfinite": "test_optimizer_guard.py: skip_nonfinite=True without amp",
    "amp_overflow": "tests/amp/test_overflow.py: an inf / nan grad under amp (O1, O2) skips the step",
    "amp_skip_nonfinite": "tests/amp/test_skip_nonfinite.py: amp's skip_nonfinite at O0 / O3",
    "state_dict": "tests/test_weights_only.py: the state dict loads with torch.load(weights_only=True) and "
                  "resumes",
    "compile": "test_optimizer_compile.py: the step traces as one graph and steps as eager",
    "amp_compile": "tests/amp/test_compile.py (its cases: tests/amp/compile_cases.py): the whole compiled amp "
                   "train step skips an overflow as eager",
    "sharded": "tests/parallel/test_sharded_optimizers.py (FSDP2 on gloo) and tests/parallel/test_fsdp_cuda.py "
               "(amp O2 on FSDP2 over NCCL)",
    "capturable": "test_capturable.py: capturable=True holds the lr on the device; a compiled step follows a "
                  "schedule",
    "cuda_graphs": "test_cuda_graphs.py: a captured step replays as eager steps (CUDA alone, by its nature)",
    "twin": "test_fused_twin.py: fused_twin of the torch.optim optimizer continues as it would",
    "apex_alias": "test_optimizer_apex_alias.py: the Apex import path gives this class, which steps",
}
__doc__ += "".join(f"  {key}: {what}\n" for key, what in GENERIC_TESTS.items())


@dataclasses.dataclass(frozen=True)
class Tolerance:
    ulps: int  # float32 ulps of the largest |expected| of a tensor, after optim_cases.STEPS steps
    why: str


@dataclasses.dataclass(frozen=True)
class Config:
    """Constructor kwargs and the param dtype they step; a variant's ``not_applicable``
    adds to its entry's."""
    kwargs: dict
    dtype: torch.dtype = torch.float32
    not_applicable: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class OptimizerInfo:
    name: str
    cls: type
    module: ModuleType  # its ``op`` is what a test swaps for the reference kernels (core_ops.reference)
    typical: Config
    every_path: Config  # every path of its kernel on, and no clipping (the device contract)
    torch_optimizer: Callable | None  # (params, **kwargs) -> the torch.optim optimizer stepping as it does
    apex_alias: str  # the dotted path an Apex script imports it by
    across_devices: Tolerance  # the CUDA kernel against the CPU kernel
    against_reference: Tolerance  # the native CPU kernel against core_ops.reference's
    not_applicable: dict  # generic test (GENERIC_TESTS) -> why it does not apply
    variants: dict = dataclasses.field(default_factory=dict)  # name -> Config: other layouts and paths
    # Options Apex kept as attributes, out of its checkpoints' groups: a value other than the default.
    apex_attributes: dict = dataclasses.field(default_factory=dict)
    dtypes: tuple = (torch.float32, torch.float16, torch.bfloat16, torch.float64)  # param dtypes it steps
    takes_master_weights: bool = True  # False: masters always, and no such argument
    collectives: int = 0  # all_reduce calls a step on FSDP2 shards makes (whole-tensor norms)

    def make(self, params, config=None, **overrides):
        """The optimizer over ``params`` with ``config``'s kwargs (default: typical),
        ``overrides`` on top."""
        kwargs = {**(config or self.typical).kwargs, **overrides}
        if not self.takes_master_weights and kwargs.pop("master_weights", True) is not True:
            raise ValueError(f"{self.name} always keeps fp32 masters")
        return self.cls(params, **kwargs)

    def applies(self, *tests, config=None):
        return not any(t in self.not_applicable or t in (config.not_applicable if config else {}) for t in tests)


BIT_EXACT = Tolerance(0, "Note [CUDA against CPU kernels] (test_optimizer_device_contract.py): one math "
                         "header, every + and * rounded once on both devices: the same bits")
NORMS = Tolerance(12, "per-tensor norms are summed in another order on the GPU (its blocks, not the CPU's "
                      "vector lanes): a few ulps a step")
REFERENCE = Tolerance(4, "the reference kernels run torch's ops, which may fuse a*x + b*y into one FMA where "
                         "the native kernel rounds twice (Note [Test tolerances], tests/conftest.py): measured "
                         "at most 2 ulps after 20 steps, 0 for Adam")
NOT_CAPTURABLE = dict.fromkeys(("capturable", "cuda_graphs"), "capturable= is FusedAdam's alone, as in Apex")
NO_GRAD_NORM = "its step takes no norm of the grads unless asked to clip (test_fused_adam.py: " \
               "test_max_grad_norm_flags_overflow)"

adam = OptimizerInfo(
    name="adam", cls=FusedAdam, module=core_ops.optimizers.fused_adam,
    typical=Config(dict(lr=1e-2, weight_decay=0.01)),
    every_path=Config(dict(lr=1e-2, weight_decay=0.1, amsgrad=True)),
    torch_optimizer=lambda ps, adam_w_mode=True, **kw: (torch.optim.AdamW if adam_w_mode else torch.optim.Adam)(
        ps, **kw),
    apex_alias="apex.optimizers.fused_adam.FusedAdam",
    across_devices=BIT_EXACT, against_reference=REFERENCE,
    not_applicable={"apex_attributes": "of the options in its groups, Apex's FusedAdam kept only adam_w_mode out, "
                                       "as torch 2.6's Adam did: test_fused_adam.py's test_a_torch_2_6_state_"
                                       "dict_keeps_the_constructor_s_mode_and_says_so",
                    "norm_overflow": NO_GRAD_NORM},
    variants={
        "l2": Config(dict(lr=1e-2, weight_decay=0.05, adam_w_mode=False)),
        "amsgrad": Config(dict(lr=1e-2, weight_decay=0.05, amsgrad=True)),
        "masters": Config(dict(lr=1e-2, master_weights=True), torch.bfloat16,
                          dict.fromkeys(("torch_counterpart", "twin"), "torch.optim keeps no fp32 masters")),
        "capturable": Config(dict(lr=1e-2, capturable=True), not_applicable={
            "torch_counterpart": "torch.optim's capturable Adam takes no CPU params",
            "twin": "torch.optim's capturable Adam takes no CPU params, and fused_twin makes a plain FusedAdam"}),
        "bf16-moments": Config(dict(lr=1e-2, state_dtype=torch.bfloat16), not_applicable=dict.fromkeys(
            ("torch_counterpart", "twin"), "torch.optim keeps float32 moments")),
    },
)

AMP_REMAINDERS = "amp builds the remainders itself: amp.initialize(master_weights='remainder'), " \
                 "tests/amp/test_master_remainders.py"
adam_compact = OptimizerInfo(
    name="adam-compact", cls=FusedAdam, module=core_ops.optimizers.fused_adam,
    typical=Config(dict(lr=1e-2, weight_decay=0.01, master_weights="remainder", state_dtype="int8",
                        min_8bit_size=1), torch.bfloat16),
    every_path=Config(dict(lr=1e-2, weight_decay=0.1, master_weights="remainder", state_dtype="int8",
                           min_8bit_size=1), torch.bfloat16),
    torch_optimizer=None, apex_alias="apex.optimizers.fused_adam.FusedAdam",
    across_devices=BIT_EXACT, against_reference=REFERENCE, dtypes=(torch.bfloat16,),
    not_applicable={
        "contract": "master_weights='remainder' needs bfloat16 params and the contract steps float32 ones; "
                    "the compact layouts' own contract is test_fused_adam_compact.py",
        "device_contract": "test_fused_adam_compact.py runs its kernel on both devices, bit for bit, skipped "
                           "steps and grad_scale included",
        "torch_counterpart": "torch.optim keeps neither remainders nor 8-bit moments (its AdamW state loads "
                             "into this one: test_fused_adam_compact.py)",
        "twin": "torch.optim keeps neither remainders nor 8-bit moments",
        "amp_overflow": AMP_REMAINDERS, "amp_skip_nonfinite": AMP_REMAINDERS, "amp_compile": AMP_REMAINDERS,
        "sharded": "tests/parallel/test_compact_state_parallel.py runs compact state on FSDP2",
        "capturable": "test_capturable.py's groups hold float32 and float64 params, which remainders refuse; "
                      "the lr handling is the same class's (the adam entry), this state's capture is cuda_graphs",
        "apex_alias": "the same class as the adam entry",
    },
)

sgd = OptimizerInfo(
    name="sgd", cls=FusedSGD, module=core_ops.optimizers.fused_sgd,
    typical=Config(dict(lr=0.1, momentum=0.9)),
    every_path=Config(dict(lr=1e-2, momentum=0.9, nesterov=True, weight_decay=0.1)),
    torch_optimizer=lambda ps, **kw: torch.optim.SGD(ps, **kw),
    apex_alias="apex.optimizers.fused_sgd.FusedSGD",
    across_devices=BIT_EXACT, against_reference=REFERENCE, apex_attributes=dict(wd_after_momentum=True),
    not_applicable={"norm_overflow": NO_GRAD_NORM, "apex_group_step": "Apex's FusedSGD counts no steps",
                    **NOT_CAPTURABLE},
    variants={
        # A first step that may be skipped must not leave a buffer that reads as a step
        # taken: with dampening, that is decided on the host (not in a compiled first step).
        "damped": Config(dict(lr=0.1, momentum=0.9, dampening=0.5)),
        "nesterov": Config(dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)),
    },
)

adagrad = OptimizerInfo(
    name="adagrad", cls=FusedAdagrad, module=core_ops.optimizers.fused_adagrad,
    typical=Config(dict(lr=0.1)),
    every_path=Config(dict(lr=1e-2, weight_decay=0.1, lr_decay=0.01)),
    torch_optimizer=lambda ps, **kw: torch.optim.Adagrad(ps, **kw),
    apex_alias="apex.optimizers.fused_adagrad.FusedAdagrad",
    across_devices=BIT_EXACT, against_reference=REFERENCE, apex_attributes=dict(adagrad_w_mode=True),
    not_applicable={"norm_overflow": NO_GRAD_NORM, "apex_group_step": "Apex's FusedAdagrad counts no steps",
                    **NOT_CAPTURABLE},
    variants={"decayed": Config(dict(lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1))},
)

NO_TORCH_LAMB = "torch.optim has no LAMB"
lamb = OptimizerInfo(
    name="lamb", cls=FusedLAMB, module=core_ops.optimizers.fused_lamb,
    typical=Config(dict(lr=1e-2)),
    # No clipping: a clipped step divides by a norm each device sums in its own order.
    every_path=Config(dict(lr=1e-2, weight_decay=0.1, max_grad_norm=0.0)),
    torch_optimizer=None, apex_alias="apex.optimizers.fused_lamb.FusedLAMB",
    across_devices=NORMS, against_reference=REFERENCE,
    apex_attributes=dict(adam_w_mode=False, use_nvlamb=True), collectives=2,
    not_applicable={"torch_counterpart": NO_TORCH_LAMB, "twin": NO_TORCH_LAMB, **NOT_CAPTURABLE},
)

mp_lamb = OptimizerInfo(
    name="mp_lamb", cls=FusedMixedPrecisionLamb, module=core_ops.optimizers.fused_lamb,
    typical=Config(dict(lr=1e-2, reduced_precision_dtype=torch.bfloat16), torch.bfloat16),
    every_path=Config(dict(lr=1e-2, weight_decay=0.1, max_grad_norm=0.0)),
    torch_optimizer=None, apex_alias="apex.optimizers.fused_mixed_precision_lamb.FusedMixedPrecisionLamb",
    across_devices=NORMS, against_reference=REFERENCE,
    apex_attributes=dict(adam_w_mode=False, use_nvlamb=True), collectives=2,
    dtypes=(torch.float32, torch.float16, torch.bfloat16), takes_master_weights=False,
    not_applicable={"float64": "it takes float32 and half params only, as Apex's",
                    "torch_counterpart": NO_TORCH_LAMB, "twin": NO_TORCH_LAMB, **NOT_CAPTURABLE},
)

NO_TORCH_NOVOGRAD = "torch.optim has no NovoGrad"
novograd = OptimizerInfo(
    name="novograd", cls=FusedNovoGrad, module=core_ops.optimizers.fused_novograd,
    typical=Config(dict(lr=1e-2)),
    every_path=Config(dict(lr=5e-2, weight_decay=0.1)),
    torch_optimizer=None, apex_alias="apex.optimizers.fused_novograd.FusedNovoGrad",
    across_devices=NORMS,
    against_reference=Tolerance(8, "as REFERENCE, and its one-value second moment is the square of a norm "
                                   "torch sums in another order: measured 6.2 ulps"),
    apex_attributes=dict(reg_inside_moment=True), collectives=1,
    not_applicable={"torch_counterpart": NO_TORCH_NOVOGRAD, "twin": NO_TORCH_NOVOGRAD,
                    **NOT_CAPTURABLE,
                    "apex_group_step": "Apex's FusedNovoGrad keeps its layer norms in the groups too: "
                                       "tests/compat/test_amp_C_lamb_novograd.py loads such a checkpoint"},
    variants={"max-norm": Config(dict(lr=1e-2, norm_type=0))},
)

OPTIMIZERS = {info.name: info for info in (adam, adam_compact, sgd, adagrad, lamb, mp_lamb, novograd)}


def cases(*tests, variants=False):
    """pytest params of the entries every one of ``tests`` applies to, ids their names;
    with ``variants``, (entry, config) pairs of every config, ids ``name/variant``."""
    out = []
    for info in OPTIMIZERS.values():
        if not variants:
            if info.applies(*tests):
                out.append(pytest.param(info, id=info.name))
            continue
        for label, config in {"": info.typical, **info.variants}.items():
            if info.applies(*tests, config=config):
                out.append(pytest.param(info, config, id=f"{info.name}/{label}" if label else info.name))
    return out


def dtype_cases(*tests):
    """(entry, dtype) params of every param dtype each applicable entry steps."""
    return [pytest.param(info, dtype, id=f"{info.name}-{str(dtype)[6:]}")
            for info in OPTIMIZERS.values() if info.applies(*tests) for dtype in info.dtypes]
