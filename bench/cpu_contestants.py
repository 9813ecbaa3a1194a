"""The contestants of bench_cpu_optimizers.py, the fp64 references they are held to,
and the worker process that runs one contestant.

The coordinator starts this file with the python of a contestant's venv,

    <venv>/bin/python bench/cpu_contestants.py

and speaks JSON lines to it (``serve``). Only torch and the standard library are
imported at the top: the same file runs under torch 2.14 with core-ops and DeepSpeed
and under torch 2.8 with IPEX; a contestant imports its own package when it is built.
"""

import gc
import json
import os
import sys
import time
import traceback
import types
from dataclasses import dataclass, field
from typing import Callable

import torch

LR, WD = 1e-3, 0.01
# The update rule every family is held to. Adam and LAMB decay decoupled (AdamW; LAMB
# adds it to the update before the trust ratio, as You et al. and IPEX's Lamb do). SGD
# and Adagrad take torch.optim's L2 decay: no peer offers them decoupled.
HYPER = dict(adam=dict(lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=WD),
             lamb=dict(lr=LR, betas=(0.9, 0.999), eps=1e-6, weight_decay=WD),
             sgd=dict(lr=LR, momentum=0.9, weight_decay=WD),
             adagrad=dict(lr=LR, eps=1e-10, weight_decay=WD))
FAMILIES = tuple(HYPER)
# The check's grads are g * c_k, step k: with one fixed grad Adam's step is lr * sign(g)
# whatever the moments hold, so they would go untested. Powers of two keep g * c_k exact
# in float32 and bfloat16, so every contestant sees the reference's grads (rounded once).
GRAD_SCALES = (1.0, -0.5, 2.0, -1.0, 0.5)
ROW = 256  # the IPEX / amp models hold each tensor as an Embedding of rows of 256


# ---- the fp64 references ----------------------------------------------------------

def _lamb_step_(ps, gs, ms, vs, step, lr, betas, eps, weight_decay):
    """LAMB without grad clipping: Adam's bias-corrected direction plus decoupled decay,
    scaled per tensor by ||p|| / ||update||."""
    b1, b2 = betas
    for p, g, m, v in zip(ps, gs, ms, vs):
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        u = (m / (1 - b1 ** step)) / ((v / (1 - b2 ** step)).sqrt() + eps) + weight_decay * p
        pn, un = p.norm(), u.norm()
        p.add_(u, alpha=-lr * (pn / un).item() if pn > 0 and un > 0 else -lr)


def reference_delta(family, p0, g0, sizes):
    """Params after len(GRAD_SCALES) fp64 steps of ``family`` less ``p0`` (flat fp64):
    torch.optim's AdamW, SGD and Adagrad, and ``_lamb_step_``."""
    ps = [t.double() for t in p0.split(sizes)]
    gs = [t.double() for t in g0.split(sizes)]
    hyper = HYPER[family]
    if family == "lamb":
        ms, vs = [torch.zeros_like(p) for p in ps], [torch.zeros_like(p) for p in ps]
        for k, c in enumerate(GRAD_SCALES):
            _lamb_step_(ps, [g * c for g in gs], ms, vs, k + 1, **hyper)
    else:
        cls = dict(adam=torch.optim.AdamW, sgd=torch.optim.SGD, adagrad=torch.optim.Adagrad)[family]
        opt = cls(ps, foreach=True, **hyper)
        for c in GRAD_SCALES:
            for p, g in zip(ps, gs):
                p.grad = g * c
            opt.step()
    return torch.cat([p.view(-1) for p in ps]) - p0.double()


# ---- how each contestant is built -------------------------------------------------

@dataclass
class Built:
    """A contestant ready to step: ``params`` as the model holds them (grads go there),
    ``masters()`` their fp32 masters in the same order (or None), and ``roots``: more
    objects whose tensors persist between steps (a model)."""
    params: list
    opt: object
    masters: Callable = lambda: None
    roots: tuple = ()
    feed: Callable = None  # how grads reach the optimizer, when not by p.grad


class Holder(torch.nn.Module):
    """A model made of the params: each an Embedding of rows of ROW values, a layer
    that IPEX casts to bfloat16 (it leaves a bare Parameter in float32)."""

    def __init__(self, ps):
        super().__init__()
        self.layers = torch.nn.ModuleList(
            torch.nn.Embedding(p.numel() // ROW, ROW, _weight=p.view(-1, ROW)) for p in ps)


def _leaves(ps, dtype):
    return [p.to(dtype).requires_grad_() for p in ps]


def torch_builtin(name, variant):
    def build(ps, family):
        ps = _leaves(ps, torch.float32)
        return Built(ps, getattr(torch.optim, name)(ps, **HYPER[family], **{variant: True}))
    return build


def core_ops(dtype=torch.float32, **options):
    def build(ps, family):
        from core_ops import optimizers
        from core_ops.reference.compact_state import join_master
        cls = dict(adam="FusedAdam", lamb="FusedLAMB", sgd="FusedSGD", adagrad="FusedAdagrad")[family]
        extra = dict(max_grad_norm=0.0) if family == "lamb" else {}  # the reference does not clip
        ps = _leaves(ps, dtype)
        opt = getattr(optimizers, cls)(ps, **HYPER[family], **extra, **options)
        mode = options.get("master_weights", False)
        if mode is True:
            masters = lambda: [opt.state[p]["master_param"] for p in ps if "master_param" in opt.state[p]]  # noqa: E731
        elif mode == "remainder":
            masters = lambda: [join_master(p.detach(), opt.state[p]["master_remainder"])  # noqa: E731
                               for p in ps if "master_remainder" in opt.state[p]]
        else:
            masters = lambda: None  # noqa: E731
        return Built(ps, opt, masters)
    return build


def core_ops_amp_o2(ps, family):
    """amp.initialize's O2 in bfloat16 on a model of the params; grads reach the fp32
    masters as in training, through a backward inside amp.scale_loss (untimed)."""
    from core_ops import amp
    from core_ops.optimizers import FusedAdam
    model = Holder(ps)
    opt = FusedAdam(model.parameters(), **HYPER[family])
    model, opt = amp.initialize(model, opt, opt_level="O2", half_dtype=torch.bfloat16, verbosity=0)
    held = list(model.parameters())

    def feed(grads):
        loss = sum((p.float() * g.view_as(p).float()).sum() for p, g in zip(held, grads))
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()  # d loss / d p = g: each bfloat16 grad is g rounded once
    return Built(held, opt, lambda: list(amp.master_params(opt)), (model,), feed)


def deepspeed(dtype=torch.float32, fp32_optimizer_states=True):
    def build(ps, family):
        ps = _leaves(ps, dtype)
        if family == "adam":
            from deepspeed.ops.adam import DeepSpeedCPUAdam as cls
        else:
            from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad as cls
        return Built(ps, cls(ps, **HYPER[family], fp32_optimizer_states=fp32_optimizer_states))
    return build


def _join_halves(top, trail):
    """The float32 whose upper 16 bits are bfloat16 ``top``'s and lower 16 ``trail``'s
    (IPEX's split master: the param is the master truncated, trail the bits cut off)."""
    hi = top.view(torch.int16).to(torch.int64) & 0xFFFF
    lo = trail.view(torch.int16).to(torch.int64) & 0xFFFF
    bits = (hi << 16) | lo
    return torch.where(bits >= 2 ** 31, bits - 2 ** 32, bits).to(torch.int32).view(torch.float32)


def ipex(dtype=torch.float32, split=False, cls_name=None, decoupled=True):
    """``ipex.optimize(model, optimizer=..., dtype=...)``: IPEX swaps in its fused step
    (on CPU for torch's SGD, Adagrad and Adam and its own Lamb). For Adam the row asks
    for AdamW as torch 2.8 spells it, Adam(decoupled_weight_decay=True), unless
    ``cls_name`` names AdamW, which IPEX leaves unfused on CPU."""
    def build(ps, family):
        import intel_extension_for_pytorch as ipex_
        model = Holder(ps).train()
        hyper = dict(HYPER[family])
        if family == "lamb":
            from intel_extension_for_pytorch.optim._lamb import Lamb as cls
        else:
            cls = getattr(torch.optim, cls_name or dict(adam="Adam", sgd="SGD", adagrad="Adagrad")[family])
            if cls is torch.optim.Adam and decoupled:
                hyper["decoupled_weight_decay"] = True
        opt = cls(model.parameters(), **hyper)
        options = dict(split_master_weight_for_bf16=split) if dtype == torch.bfloat16 else {}
        model, opt = ipex_.optimize(model, optimizer=opt, dtype=dtype, weights_prepack=False, **options)
        held = list(model.parameters())
        attrs = getattr(opt, "params_attr", {})
        group = opt.param_groups[0]["params"]
        if dtype == torch.float32:
            masters = lambda: None  # noqa: E731
        elif split:
            masters = lambda: [_join_halves(p.detach(), attrs[p].parameter_trail) for p in group]  # noqa: E731
        else:
            masters = lambda: list(group)  # noqa: E731 (the optimizer steps the fp32 masters)
        return Built(held, opt, masters, (model,))
    return build


def torchao_adamw8bit(ps, family):
    from torchao.optim import AdamW8bit
    ps = _leaves(ps, torch.bfloat16)
    return Built(ps, AdamW8bit(ps, **HYPER[family]))


def bitsandbytes_adamw8bit(ps, family):
    import bitsandbytes as bnb
    ps = _leaves(ps, torch.bfloat16)
    return Built(ps, bnb.optim.AdamW8bit(ps, **HYPER[family]))


@dataclass(frozen=True)
class Contestant:
    """One row: ``venv`` names its environment (bench_cpu_optimizers.VENVS), ``package``
    the distribution whose version it reports; ``baseline``: core-ops fp32, the row
    the ratios divide by; ``moved``: the bytes a step reads and writes per param (MOVED)."""
    label: str
    family: str
    venv: str
    package: str
    build: Callable = field(repr=False)
    baseline: bool = False
    note: str = ""
    moved: float = 0.0


BF16 = torch.bfloat16
IPEX_ADAM_NOTE = ("Adam(decoupled_weight_decay=True) asks for AdamW; the decay probe below "
                  "says which decay IPEX's fused step applies")


# The memory model of an Adam step: bytes read and written per param. Every state
# tensor is read and written, the grad read; a param with a master is only written
# (the master is read instead). fp32: param 8 + grad 4 + two moments 16 = 28;
# bf16 + masters: param 2 + grad 2 + master 8 + moments 16 = 28; amp O2 steps the fp32
# masters with their fp32 grads and writes the bf16 model in the same pass (Note [Half
# params written in the step]): param 2 + grad 4 + master 8 + moments 16 = 30;
# remainders: param 4 + remainder 4 + grad 2 + moments 16 = 26, with bf16 moments 18,
# with 8-bit moments 14 (+ 2 block maxima of 4 bytes per 256 params, read and written:
# 0.06). DeepSpeed's bf16 params without masters: 4 + 2 + 16 = 22, with bf16 moments 14.
# A write that misses the cache also reads its line first (write-allocate); the model
# leaves that out for every row alike.
MOVED = {"fp32": 28.0, "masters": 28.0, "amp_o2": 30.0, "remainder": 26.0, "remainder_bf16": 18.0,
         "remainder_8bit": 14.0 + 16 / 256, "bf16_no_masters": 22.0, "bf16_bf16_moments": 14.0}


def contestants():
    out = [
        Contestant("torch AdamW(fused=True) fp32", "adam", "main", "torch", torch_builtin("AdamW", "fused"),
                   moved=MOVED["fp32"]),
        Contestant("core-ops FusedAdam fp32", "adam", "main", "core-ops", core_ops(), baseline=True,
                   moved=MOVED["fp32"]),
        Contestant("DeepSpeed DeepSpeedCPUAdam fp32", "adam", "main", "deepspeed", deepspeed(), moved=MOVED["fp32"]),
        Contestant("IPEX Adam fp32 (fused)", "adam", "ipex", "intel-extension-for-pytorch", ipex(),
                   note=IPEX_ADAM_NOTE),
        Contestant("core-ops bf16 + fp32 masters", "adam", "main", "core-ops", core_ops(BF16, master_weights=True),
                   moved=MOVED["masters"]),
        Contestant("core-ops amp O2 (bf16) + FusedAdam", "adam", "main", "core-ops", core_ops_amp_o2,
                   moved=MOVED["amp_o2"]),
        Contestant("IPEX bf16 + fp32 masters", "adam", "ipex", "intel-extension-for-pytorch", ipex(BF16),
                   note=IPEX_ADAM_NOTE),
        Contestant("IPEX bf16 + fp32 masters, AdamW class (unfused)", "adam", "ipex", "intel-extension-for-pytorch",
                   ipex(BF16, cls_name="AdamW"),
                   note="IPEX's CPU fused step has no AdamW: it runs torch's AdamW on the masters"),
        Contestant("core-ops bf16 + int16 remainders", "adam", "main", "core-ops",
                   core_ops(BF16, master_weights="remainder"), moved=MOVED["remainder"]),
        Contestant("IPEX bf16 split masters", "adam", "ipex", "intel-extension-for-pytorch", ipex(BF16, split=True),
                   note=IPEX_ADAM_NOTE),
        Contestant("DeepSpeed bf16 params + fp32 moments", "adam", "main", "deepspeed", deepspeed(BF16),
                   note="no masters: each update is rounded to bfloat16", moved=MOVED["bf16_no_masters"]),
        Contestant("core-ops remainders + bf16 moments", "adam", "main", "core-ops",
                   core_ops(BF16, master_weights="remainder", state_dtype=BF16), moved=MOVED["remainder_bf16"]),
        Contestant("core-ops remainders + 8-bit moments", "adam", "main", "core-ops",
                   core_ops(BF16, master_weights="remainder", state_dtype="int8"), moved=MOVED["remainder_8bit"]),
        Contestant("DeepSpeed bf16 params + bf16 moments", "adam", "main", "deepspeed",
                   deepspeed(BF16, fp32_optimizer_states=False), note="fp32_optimizer_states=False; no masters",
                   moved=MOVED["bf16_bf16_moments"]),
        Contestant("bitsandbytes AdamW8bit, bf16 params", "adam", "quant", "bitsandbytes", bitsandbytes_adamw8bit,
                   note="no masters"),
        Contestant("torchao AdamW8bit, bf16 params", "adam", "quant", "torchao", torchao_adamw8bit,
                   note="no masters"),
    ]
    for family, name in (("lamb", "FusedLAMB"), ("sgd", "FusedSGD"), ("adagrad", "FusedAdagrad")):
        torch_name = dict(sgd="SGD", adagrad="Adagrad").get(family)
        if torch_name:
            out.append(Contestant(f"torch {torch_name}(fused=True) fp32", family, "main", "torch",
                                  torch_builtin(torch_name, "fused")))
        out.append(Contestant(f"core-ops {name} fp32", family, "main", "core-ops", core_ops(), baseline=True))
        if family == "adagrad":
            out.append(Contestant("DeepSpeed DeepSpeedCPUAdagrad fp32", family, "main", "deepspeed", deepspeed()))
        ipex_name = "Lamb" if family == "lamb" else torch_name
        out.append(Contestant(f"IPEX {ipex_name} fp32 (fused)", family, "ipex", "intel-extension-for-pytorch", ipex()))
        out.append(Contestant(f"core-ops {name} bf16 + fp32 masters", family, "main", "core-ops",
                              core_ops(BF16, master_weights=True)))
        out.append(Contestant(f"IPEX {ipex_name} bf16 + fp32 masters", family, "ipex", "intel-extension-for-pytorch",
                              ipex(BF16)))
        out.append(Contestant(f"IPEX {ipex_name} bf16 split masters", family, "ipex", "intel-extension-for-pytorch",
                              ipex(BF16, split=True)))
        if family == "adagrad":
            out.append(Contestant("DeepSpeed DeepSpeedCPUAdagrad bf16 params + fp32 state", family, "main",
                                  "deepspeed", deepspeed(BF16), note="no masters"))
    return out


# ---- measuring ----------------------------------------------------------------------

def _tensors_in(obj, depth=4):
    """Every tensor reachable from ``obj`` through containers and plain objects' fields
    (a tensor subclass, e.g. torchao's 8-bit state, by the parts it flattens into)."""
    if isinstance(obj, torch.Tensor):
        if type(obj) is not torch.Tensor and type(obj) is not torch.nn.Parameter and hasattr(obj, "__tensor_flatten__"):
            names, _ = obj.__tensor_flatten__()
            for name in names:
                yield from _tensors_in(getattr(obj, name), depth)
        else:
            yield obj
        return
    if depth == 0 or isinstance(obj, (str, bytes, int, float, bool, type(None), torch.nn.Module, types.ModuleType)):
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _tensors_in(k, depth - 1)
            yield from _tensors_in(v, depth - 1)
    elif isinstance(obj, (list, tuple, set)):
        for v in obj:
            yield from _tensors_in(v, depth - 1)
    elif hasattr(obj, "__dict__") and not callable(obj):
        yield from _tensors_in(vars(obj), depth - 1)


def bytes_per_param(built):
    """Bytes that persist between steps, per param element: the params as held, every
    tensor in the optimizer's per-param state (masters, remainders, moments, block
    maxima, IPEX's trails) and elsewhere on the optimizer (IPEX's params_attr), and the
    model's; each storage once, grads left out. Left out too, as the issue asks: 0-d
    tensors (step counts) and shared maps, i.e. a storage in the state of more than one
    param, or one outside the per-param state of at most 256 values (lr, 8-bit maps)."""
    stepped = [*built.params, *(p for group in built.opt.param_groups for p in group["params"])]
    grads = {p.grad.untyped_storage().data_ptr() for p in stepped if p.grad is not None}
    owners, size = {}, {}

    def add(t, owner):
        if t.dim() == 0 or t.is_sparse:
            return
        key = t.untyped_storage().data_ptr()
        if key in grads:
            return
        size[key] = max(size.get(key, 0), t.untyped_storage().nbytes())
        owners.setdefault(key, set()).add(owner)

    opt = built.opt
    for p in built.params:
        add(p, "param")
    for group in opt.param_groups:
        for p in group["params"]:
            add(p, "param")
    for i, (p, state) in enumerate(opt.state.items()):
        for t in _tensors_in(state):
            add(t, i)
    for name, value in vars(opt).items():
        if name not in ("state", "param_groups", "defaults"):
            for t in _tensors_in(value):
                add(t, "other" if t.numel() > 256 else "small")
    for root in built.roots:
        for t in (*root.parameters(), *root.buffers()):
            add(t, "param")
    kept = sum(n for key, n in size.items()
               if "small" not in owners[key] and len([o for o in owners[key] if isinstance(o, int)]) <= 1)
    return kept / sum(p.numel() for p in built.params)


def _flat_pairs(after, before):
    return [(a.detach().reshape(-1), b.reshape(-1)) for a, b in zip(after, before)]


def update_error(after, before, ref):
    """(||dp - dp_ref|| / ||dp_ref||, share of elements that never moved), dp = after -
    before over all tensors in order, ``ref`` the flat fp64 reference delta."""
    num = den = 0.0
    still = total = offset = 0
    for a, b in _flat_pairs(after, before):
        r = ref[offset:offset + a.numel()]
        d = a.double() - b.double()
        num += (d - r).square().sum().item()
        den += r.square().sum().item()
        still += (a == b).sum().item()
        total += a.numel()
        offset += a.numel()
    return (num / den) ** 0.5 if den else float("nan"), still / total


# ---- the worker -------------------------------------------------------------------

def _load(path, numel, sizes):
    whole = torch.from_file(path, shared=False, size=numel, dtype=torch.float32)
    return [t.clone() for t in whole.split(sizes)]


def _give(built, grads):
    if built.feed is not None:
        built.feed(grads)
        return
    for p, g in zip(built.params, grads):
        p.grad = g.view_as(p).to(p.dtype)


def _version(package):
    try:
        from importlib.metadata import version
        return version(package)
    except Exception:  # noqa: BLE001 (a source tree on the path has no metadata)
        return "unknown"


class Worker:
    def __init__(self):
        self.built = None
        self.contestant = None

    def setup(self, msg):
        """Builds the contestant on the coordinator's params and grads, runs the check's
        steps and ``warmup`` more, and reports its numbers."""
        self.built = None
        gc.collect()
        torch.manual_seed(0)
        torch.set_num_threads(msg["threads"])
        self.contestant = next(c for c in contestants() if c.label == msg["label"])
        sizes, numel = msg["sizes"], sum(msg["sizes"])
        t0 = time.perf_counter()
        built = self.contestant.build(_load(msg["params"], numel, sizes), self.contestant.family)
        grads = _load(msg["grads"], numel, sizes)
        before = [p.detach().clone() for p in built.params]
        masters0 = built.masters()
        masters0 = [m.detach().clone() for m in masters0] if masters0 else [b.float() for b in before]
        for c in GRAD_SCALES:
            _give(built, [g * c for g in grads])
            built.opt.step()
        ref = torch.from_file(msg["reference"], shared=False, size=numel, dtype=torch.float64)
        error, still = update_error(built.params, before, ref)
        masters = built.masters()
        master_error = update_error(masters, masters0, ref)[0] if masters else None
        del ref, before, masters0, masters
        _give(built, grads)  # the grads every timed step sees
        del grads
        for _ in range(msg["warmup"]):
            built.opt.step()
        self.built = built
        return dict(ok=True, bytes_per_param=bytes_per_param(built), error=error, master_error=master_error,
                    never_moved=still, setup_s=time.perf_counter() - t0, dtype=str(built.params[0].dtype),
                    python=sys.executable, python_version=sys.version.split()[0], torch=torch.__version__,
                    package=self.contestant.package, package_version=_version(self.contestant.package),
                    threads=torch.get_num_threads())

    def time(self, msg):
        ms = []
        for _ in range(msg["steps"]):
            t0 = time.perf_counter()
            self.built.opt.step()
            ms.append((time.perf_counter() - t0) * 1e3)
        return dict(ok=True, ms=ms)

    def decay_probe(self, msg):
        return dict(ok=True, probe=ipex_decay_probe())


def ipex_decay_probe():
    """Which weight decay IPEX's optimized step applies, on a small model: for each way
    of asking for AdamW, the distance of its update after 3 steps from torch's own
    AdamW (decoupled) and from torch's Adam (L2) run on copies, relative to the update."""
    import intel_extension_for_pytorch as ipex_
    g = torch.Generator().manual_seed(0)
    ps = [torch.randn(64 * ROW, generator=g) for _ in range(2)]
    gs = [torch.randn(64 * ROW, generator=g) * 1e-2 for _ in ps]
    hyper = dict(lr=1e-2, weight_decay=0.1)  # a decay large enough to tell the two apart

    def run(make, dtype=None):
        model = Holder([p.clone() for p in ps]).train()
        opt = make(model.parameters())
        if dtype is not None:
            model, opt = ipex_.optimize(model, optimizer=opt, dtype=dtype, weights_prepack=False)
        held = list(model.parameters())
        for _ in range(3):
            for p, gr in zip(held, gs):
                p.grad = gr.view_as(p).to(p.dtype)
            opt.step()
        return torch.cat([p.detach().float().reshape(-1) for p in held]) - torch.cat(ps)

    adamw = run(lambda q: torch.optim.AdamW(q, **hyper))
    l2 = run(lambda q: torch.optim.Adam(q, **hyper))
    out = {}
    for name, make in (("Adam(decoupled_weight_decay=True)",
                        lambda q: torch.optim.Adam(q, decoupled_weight_decay=True, **hyper)),
                       ("AdamW", lambda q: torch.optim.AdamW(q, **hyper))):
        for dtype in (torch.float32, torch.bfloat16):
            d = run(make, dtype)
            vs_w = ((d - adamw).norm() / adamw.norm()).item()
            vs_l2 = ((d - l2).norm() / l2.norm()).item()
            out[f"{name}, {str(dtype)[6:]}"] = dict(vs_adamw=vs_w, vs_adam_l2=vs_l2,
                                                    applies="decoupled" if vs_w < vs_l2 else "L2")
    return out


def serve():
    """One JSON request a line on stdin, one JSON reply a line on the stdout it was
    started with. Libraries' own prints (DeepSpeed, IPEX) go to stderr: fd 1 is pointed
    there, so they cannot corrupt the replies."""
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    worker = Worker()
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["cmd"] == "quit":
            break
        try:
            reply = getattr(worker, msg["cmd"])(msg)
        except Exception as e:  # noqa: BLE001 (the coordinator prints it as the row's skip reason)
            traceback.print_exc()
            reply = dict(ok=False, reason=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        replies.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    serve()
