"""Every setting of core-ops, declared once.

Note [One declaration per setting]: each option is one ``Setting`` in ``SETTINGS``: its
argument name, its ``CORE_OPS_*`` variable, its parser (which validates and names the
route a bad value came from), its default (and the plugins' default where it differs
from Apex's), the value that means "never" or "off", who reads it, and its docs line.
Every route reads it through ``resolve``: ``amp.initialize`` and ``AmpLoop``, Lightning's
``ApexPrecision`` / strategies and ``apex-*`` names, Accelerate's ``ApexPlugin`` and its
environment, ``python -m core_ops info`` and the docs table (``markdown_table``, held
equal to docs/settings.md by a test). Adding an option touches this list and the code
that uses the value, nothing else.

The rule is the same everywhere: an argument given in code wins, else the variable
when it is set, else the default of the route. One convention for "never": 0
(``max_consecutive_skips=0``, ``skip_report_seconds=0``); None always means "not
given here".

This module is the ground floor: it imports nothing of core_ops (torch only inside the
parsers that build dtypes), so every module may read it, and no other module reads a
``CORE_OPS_*`` variable itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import math
import os
from typing import Any, Callable

# Apex's dynamic loss scale: where it starts, and the ceiling it grows to.
INIT_LOSS_SCALE = 2.0**16
MAX_LOSS_SCALE = 2.0**24

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
_UNSET = object()

# Who reads a setting (Setting.readers):
CORE = "core"  # core_ops itself, in every route (the build, the backend choice, the autoload)
AMP = "amp"  # amp.initialize, AmpLoop and both plugins
PLUGINS = "plugins"  # Lightning's ApexPrecision and Accelerate's ApexPlugin
DDP = "ddp"  # core_ops' DistributedDataParallel under Accelerate and Lightning's apex-ddp
ACCELERATE = "accelerate"  # Accelerate's ApexPlugin only
READERS = {CORE: "core-ops", AMP: "amp, both plugins", PLUGINS: "both plugins", DDP: "Accelerate, apex-ddp",
           ACCELERATE: "Accelerate"}


class BadEnvironment(ValueError):
    """A ``CORE_OPS_*`` variable that is misspelt or holds a value outside its set
    (core_ops_autoload.py stops the host's import on it, by this name)."""


# The names of dtypes, one table for every setting and option that takes one.
DTYPE_NAMES = {"fp32": "float32", "float32": "float32", "fp64": "float64", "float64": "float64",
               "fp16": "float16", "float16": "float16", "half": "float16", "bf16": "bfloat16",
               "bfloat16": "bfloat16"}


def dtype_of(value, where, allowed, none=None):
    """``value`` (a torch dtype or its name: "bf16", "torch.float16") as one of
    ``allowed`` (dtypes); ``none``: what None means, where None is allowed. Raises
    ValueError naming ``where``."""
    import torch
    if value is None and none:
        return None
    name = DTYPE_NAMES.get(value.strip().lower().removeprefix("torch.")) if isinstance(value, str) else None
    dtype = getattr(torch, name) if name else value
    if not isinstance(dtype, torch.dtype) or dtype not in allowed:
        also = f"None ({none}) or " if none else ""
        raise ValueError(f"{where} must be {also}one of {', '.join(map(str, allowed))} (or their names: fp32, "
                         f"bf16, ...), got {value!r}")
    return dtype


# The patches to torch (core_ops.torch_patches: one module each), by the names
# CORE_OPS_TORCH_PATCHES_OFF takes.
PATCH_NAMES = ("ddp_init_broadcast", "fsdp_policy_slots", "grad_scaler_flags", "inductor_norms",
               "inductor_twin_reductions")


# ---- parsers: (value, where) -> value; ``where`` is the route's spelling ("loss_scale" or
# "CORE_OPS_LOSS_SCALE"), so a bad value's message names what the user wrote.

def _says(where, value):
    return f"{where}={value!r}"


def flag(value, where):
    """A switch given as a bool (0 / 1 too) or as a variable's text (1 / true / yes / on, 0 / ...)."""
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    text = str(value).strip().lower()
    if isinstance(value, str) and text in _TRUE + _FALSE:
        return text in _TRUE
    raise ValueError(f"{_says(where, value)}: expected one of {', '.join(_TRUE + _FALSE)} (or True / False)")


def _choice(*allowed):
    def parse(value, where):
        text = str(value).strip().lower()  # CORE_OPS_BACKEND=Reference is meant
        if text not in allowed:
            raise ValueError(f"{_says(where, value)}: expected one of {', '.join(allowed)}")
        return text
    return parse


def opt_level(value, where):
    if value not in ("O0", "O1", "O2", "O3"):
        hint = " (the letter O, not the digit 0)" if str(value).startswith("0") else ""
        raise ValueError(f"{_says(where, value)}: expected one of O0, O1, O2, O3{hint}")
    return value


def half_dtype(value, where):
    import torch
    try:
        return dtype_of(value, where, (torch.float16, torch.bfloat16))
    except ValueError:
        raise ValueError(f"{_says(where, value)}: expected fp16 or bf16 (torch.float16 / torch.bfloat16)") from None


def loss_scale(value, where):
    if value == "dynamic":
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not (number > 0 and math.isfinite(number)):
        raise ValueError(f"{_says(where, value)}: expected 'dynamic' or a number > 0")
    return number


def tristate(value, where):
    """True, False, or None (the level's default); Apex's argparse strings "True" / "False" too."""
    return None if value is None else flag(value, where)


def master_weights(value, where):
    """True, False, None (the level's) or "remainder": bfloat16 params with int16
    remainders kept by FusedAdam (Note [Master remainders])."""
    if isinstance(value, str) and value.strip().lower() == "remainder":
        return "remainder"
    try:
        return tristate(value, where)
    except ValueError as e:
        raise ValueError(f"{e}, or remainder (bfloat16 params, their fp32 masters' lower halves in FusedAdam)") from None


def _number(kind, low, strict=True, none=False):
    """Parses a number >= ``low`` (> ``low`` when ``strict``) of ``kind``."""
    def parse(value, where):
        if value is None and none:
            return None
        try:
            number = float(value)
            ok = (not isinstance(value, bool) and math.isfinite(number) and
                  (number > low if strict else number >= low) and (kind is float or number == int(number)))
        except (TypeError, ValueError):
            ok = False
        if not ok:
            what = "an int" if kind is int else "a number"
            raise ValueError(f"{_says(where, value)}: expected {what} {'>' if strict else '>='} {low:g}")
        return kind(number)
    return parse


def never_or_count(value, where):
    """An int >= 1, or 0 for never (None: the route's default, handled by ``resolve``)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit():
        raise ValueError(f"{_says(where, value)}: expected an int >= 1, or 0 to never stop")
    return int(value)


def reduce_dtype(value, where):
    import torch
    try:
        return dtype_of(value, where, (torch.float32, torch.float64, torch.float16, torch.bfloat16))
    except ValueError:
        raise ValueError(f"{_says(where, value)}: expected torch.float32, float64, float16 or bfloat16, or its name "
                         "(fp32, fp64, fp16, bf16); unset (None): each grad's own dtype") from None


def fused_optimizer(value, where):
    """True / False, or None: on exactly when master_weights="remainder" needs it."""
    return None if value is None else flag(value, where)


def patch_names(value, where):
    """The patches to torch a value leaves out, comma-separated (``all``: every one);
    a name that is no patch raises BadEnvironment."""
    names = {n.strip() for n in str(value).split(",") if n.strip()}
    if "all" in names:
        return ",".join(PATCH_NAMES)
    unknown = sorted(names - set(PATCH_NAMES))
    if unknown:
        raise BadEnvironment(f"{where}={value!r}: {', '.join(unknown)} is not a patch to torch; expected a "
                             f"comma-separated list of {', '.join(PATCH_NAMES)}, or all")
    return ",".join(sorted(names))


def patches_off(environ=None):
    """The set of patches to torch that CORE_OPS_TORCH_PATCHES_OFF leaves out."""
    return {n for n in (core("torch_patches_off", environ) or "").split(",") if n}


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str  # the argument's name, in every route that takes it as an argument
    env: str  # its CORE_OPS_* variable
    parse: Callable[[Any, str], Any]
    default: Any  # amp.initialize's (Apex's) default, or the only one
    readers: tuple  # CORE, AMP, PLUGINS, DDP, ACCELERATE: who reads it
    doc: str
    plugin_default: Any = _UNSET  # the plugins' default where it differs from Apex's
    off: str = ""  # the value that means never / off, for the docs

    def default_for(self, route):
        if route in ("lightning", "accelerate") and self.plugin_default is not _UNSET:
            return self.plugin_default
        return self.default


SETTINGS = (
    # core_ops itself
    Setting("backend", "CORE_OPS_BACKEND", _choice("auto", "jit", "reference"), "auto", (CORE,),
            "auto: the first backend that serves each op (wheel, jit, torch, reference); jit: as auto, but native kernels are built here even where "
            "the wheel has them; reference: the pure-PyTorch kernels everywhere"),
    Setting("cpu_level", "CORE_OPS_CPU_LEVEL", _choice("baseline", "avx2", "avx512", "neon"), None, (CORE,),
            "the highest level the CPU kernels may use: baseline, avx2 or avx512 on x86-64, neon "
            "(the only one) on aarch64 (default: the highest this CPU runs)"),
    Setting("cache_dir", "CORE_OPS_CACHE_DIR", lambda v, w: str(v), None, (CORE,),
            "where native kernels are built and cached (default: $XDG_CACHE_HOME/core_ops or ~/.cache/core_ops)"),
    Setting("shared_cache", "CORE_OPS_SHARED_CACHE", _choice("0", "1"), "0", (CORE,),
            "1: a team shares the build cache on purpose: libraries of other owners and group-writable "
            "folders in it are loaded (never a folder anyone may write)", off="0"),
    Setting("cuda_arch", "CORE_OPS_CUDA_ARCH", lambda v, w: str(v), None, (CORE,),
            "the CUDA archs to build for, e.g. 9.0 or 8.0;9.0 (default: the GPUs present)"),
    Setting("verbose_build", "CORE_OPS_VERBOSE_BUILD", _choice("0", "1"), "0", (CORE,),
            "1: show the compiler's output"),
    Setting("sanitize", "CORE_OPS_SANITIZE", _choice("0", "1"), "0", (CORE,),
            "1: the CPU kernels are built (into their own cache entry, never the wheel's) and loaded with "
            "AddressSanitizer and UndefinedBehaviorSanitizer; Python must start with their runtimes "
            "preloaded: tools/sanitize.sh does both", off="0"),
    Setting("autoload", "CORE_OPS_AUTOLOAD", _choice("0", "1"), "1", (CORE,),
            "0: the plugins do not load themselves when Lightning / Accelerate is imported", off="0"),
    Setting("torch_patches_off", "CORE_OPS_TORCH_PATCHES_OFF", patch_names, None, (CORE,),
            "the patches to torch left out: their names, comma-separated, or all (docs/torch-patches.md)"),
    # the opt level and its options (amp.initialize, AmpLoop, both plugins)
    Setting("opt_level", "CORE_OPS_OPT_LEVEL", opt_level, "O1", (AMP,),
            "Apex's opt level O0-O3; the variable switches core-ops on in Accelerate, the HF Trainer and "
            "Lightning", plugin_default="O2"),
    Setting("half_dtype", "CORE_OPS_HALF_DTYPE", half_dtype, "fp16", (AMP,),
            "the half dtype of O1-O3: fp16 (Apex's) or bf16"),
    Setting("loss_scale", "CORE_OPS_LOSS_SCALE", loss_scale, None, (AMP,),
            "'dynamic' or a fixed scale > 0 (default: the level's)"),
    Setting("keep_batchnorm_fp32", "CORE_OPS_KEEP_BATCHNORM_FP32", tristate, None, (AMP,),
            "keep BatchNorm in float32 at O2 / O3 (default: the level's)"),
    Setting("master_weights", "CORE_OPS_MASTER_WEIGHTS", master_weights, None, (AMP,),
            "fp32 master weights (default: the level's), or remainder: bf16 params with int16 remainders "
            "in FusedAdam"),
    Setting("min_loss_scale", "CORE_OPS_MIN_LOSS_SCALE", _number(float, 0, strict=False, none=True), None, (AMP,),
            "the dynamic loss scale's floor (default: none)"),
    Setting("max_loss_scale", "CORE_OPS_MAX_LOSS_SCALE", _number(float, 0), MAX_LOSS_SCALE, (AMP,),
            "the dynamic loss scale's ceiling"),
    Setting("skip_nonfinite", "CORE_OPS_SKIP_NONFINITE", flag, False, (AMP,),
            "skip a step whose grads hold an inf or nan at every opt level, O0 and O3 included",
            plugin_default=True, off="0"),
    Setting("max_consecutive_skips", "CORE_OPS_MAX_CONSECUTIVE_SKIPS", never_or_count, 0, (AMP,),
            "stop with NonFiniteTraining, naming the non-finite grads, after N skipped steps in a row",
            plugin_default=50, off="0"),
    Setting("skip_report_seconds", "CORE_OPS_SKIP_REPORT_SECONDS", _number(float, 0, strict=False), 0.0, (AMP,),
            "rank 0 prints a line when steps were skipped: how many, the scale, the culprit; at most one "
            "line each N seconds", plugin_default=60.0, off="0"),
    # the plugins'
    Setting("fused_optimizer", "CORE_OPS_FUSED_OPTIMIZER", fused_optimizer, None, (PLUGINS,),
            "step a torch.optim AdamW / Adam / SGD / Adagrad with its core_ops twin (default: when "
            "master_weights=remainder needs it)", off="0"),
    Setting("sync_bn", "CORE_OPS_SYNC_BN", flag, False, (ACCELERATE,),
            "convert BatchNorm to core_ops' SyncBatchNorm (Lightning: Trainer(sync_batchnorm=True))", off="0"),
    # core_ops' DistributedDataParallel (Accelerate, Lightning's apex-ddp)
    Setting("message_size", "CORE_OPS_MESSAGE_SIZE", _number(int, 0), 10_000_000, (DDP,),
            "elements per allreduce bucket"),
    Setting("delay_allreduce", "CORE_OPS_DELAY_ALLREDUCE", flag, False, (DDP,),
            "one allreduce after backward instead of overlapping it"),
    Setting("allreduce_always_fp32", "CORE_OPS_ALLREDUCE_ALWAYS_FP32", flag, False, (DDP,),
            "reduce half grads in float32"),
    Setting("allreduce_dtype", "CORE_OPS_ALLREDUCE_DTYPE", reduce_dtype, None, (DDP,),
            "the dtype grads are reduced in (default: each grad's own)"),
    Setting("gradient_predivide_factor", "CORE_OPS_GRADIENT_PREDIVIDE_FACTOR", _number(float, 0), 1.0, (DDP,),
            "divide grads by this before the allreduce, the rest after"),
)
BY_NAME = {s.name: s for s in SETTINGS}
BY_ENV = {s.env: s for s in SETTINGS}


def core(name, environ=None):
    """A core setting's value: its variable when set and not empty, else its default,
    parsed (a bad value is refused naming the variable)."""
    setting = BY_NAME[name]
    environ = os.environ if environ is None else environ
    text = str(environ.get(setting.env, "")).strip()
    if text:
        READ.add(setting.env)
        return setting.parse(text, setting.env)
    return setting.default if setting.default is None else setting.parse(setting.default, name)


def variable(env, environ=None):
    """The text of variable ``env`` (a ``CORE_OPS_*`` name) when set and not empty, else
    None: for messages that quote what the user set."""
    environ = os.environ if environ is None else environ
    text = environ.get(env)
    return text if text is not None and str(text).strip() else None


def any_set(environ=None):
    """Whether any ``CORE_OPS_*`` variable is set, known or not (a misspelt one too)."""
    environ = os.environ if environ is None else environ
    return any(k.startswith("CORE_OPS_") for k in environ)


@contextlib.contextmanager
def _patched(values):
    texts = {}
    for name, value in values.items():
        if name not in BY_NAME:
            raise TypeError(f"settings.patch: unknown setting {name!r}; the settings are {', '.join(BY_NAME)}")
        setting = BY_NAME[name]
        if value is not None:
            setting.parse(value, name)  # refused here, not where it is read
        texts[setting.env] = None if value is None else _text(value)
    before = {env: os.environ.get(env) for env in texts}
    try:
        _set_variables(texts)
        yield
    finally:
        _set_variables(before)


def _set_variables(texts):
    """Each variable of ``texts`` set to its text, or unset for None."""
    for env, text in texts.items():
        if text is None:
            os.environ.pop(env, None)
        else:
            os.environ[env] = text


def _text(value):
    """A value as its variable's text: True -> "1", torch.bfloat16 -> "bfloat16"."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value).removeprefix("torch.")


class patch:
    """``settings.patch(backend="reference", loss_scale=128)``: the settings set, as their
    variables, for a ``with`` block or a decorated function, then restored (None: the
    variable unset). Each value is checked first. As torch's ``config.patch``; what
    reads a setting reads it as the user's variable would be read."""

    def __init__(self, **values):
        self.values = values
        self._stack = []

    def __enter__(self):
        cm = _patched(self.values)
        cm.__enter__()
        self._stack.append(cm)
        return self

    def __exit__(self, *exc):
        return self._stack.pop().__exit__(*exc)

    def __call__(self, fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            with _patched(self.values):
                return fn(*args, **kwargs)
        return run


def names(*readers):
    """The settings read by any of ``readers``, in declaration order."""
    return tuple(s.name for s in SETTINGS if set(s.readers) & set(readers))


# What each route reads from its arguments and the environment.
ROUTES = {
    "amp": names(AMP),  # amp.initialize, AmpLoop
    "lightning": names(AMP, PLUGINS),  # ApexPrecision (the apex-ddp strategy reads DDP's)
    "lightning-ddp": names(DDP),
    "accelerate": names(AMP, PLUGINS, ACCELERATE, DDP),
}


@dataclasses.dataclass
class Resolved:
    """A route's settings: each value, and where it came from ("argument", the
    variable's name, or "default")."""

    route: str
    values: dict
    sources: dict

    def __getitem__(self, name):
        return self.values[name]

    def where(self, name):
        """How the user spelt ``name`` in this route: ``CORE_OPS_X='v'`` or ``name=v``."""
        source = self.sources.get(name, "default")
        if source.startswith("CORE_OPS_"):
            return f"{source}={os.environ.get(source, self.values.get(name))!r}"
        return f"{name}={self.values.get(name)!r}"

    def how_to_set(self, name, code_value, env_value):
        """The fix for ``name`` in the route it came from: ``set CORE_OPS_X=env_value``
        when the variable gave it (or the environment drives this route), else ``pass
        name=code_value``."""
        source = self.sources.get(name, "default")
        if source.startswith("CORE_OPS_") or (source == "default" and self.from_environment):
            return f"set {BY_NAME[name].env}={env_value}"
        return f"pass {name}={code_value}"

    @property
    def from_environment(self):
        return any(s.startswith("CORE_OPS_") for s in self.sources.values())

    def given(self):
        """The settings set by an argument or a variable (not defaults)."""
        return {k: v for k, v in self.values.items() if self.sources[k] != "default"}


def resolve(route, given=None, environ=None, spelled=None, also=()):
    """The settings of ``route`` (a key of ROUTES): each from ``given`` (arguments; None
    means not given), else its variable in ``environ`` (set and not empty), else the
    route's default. Raises ValueError naming the
    argument or the variable for a bad value, or both when an argument and a set
    variable disagree (the variable would be ignored: give one of them; ``spelled``
    says how the user wrote an argument, e.g. ``precision='apex-O2'`` for half_dtype),
    and TypeError for an argument the route does not take (``also``: the caller's
    other options, for that message)."""
    given = {k: v for k, v in (given or {}).items() if v is not None}
    environ = os.environ if environ is None else environ
    wanted = ROUTES[route]
    unknown = sorted(set(given) - set(wanted))
    if unknown:
        import difflib
        named = [name + "".join(f" (did you mean {c}?)" for c in difflib.get_close_matches(name, wanted, n=1))
                 for name in unknown]
        raise TypeError(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(named)}; "
                        f"the options are {', '.join(wanted + tuple(also))}")
    values, sources = {}, {}
    for name in wanted:
        setting = BY_NAME[name]
        if str(environ.get(setting.env, "")).strip():
            READ.add(setting.env)
        if name in given:
            values[name], sources[name] = setting.parse(given[name], name), "argument"
            text = str(environ.get(setting.env, "")).strip()
            if text and setting.parse(text, setting.env) != values[name]:
                wrote = (spelled or {}).get(name, f"{name}={given[name]!r}")
                raise ValueError(f"{wrote} and {setting.env}={environ[setting.env]!r} disagree, and the variable "
                                 f"would be ignored: give one of them")
        elif str(environ.get(setting.env, "")).strip() != "":
            values[name], sources[name] = setting.parse(environ[setting.env], setting.env), setting.env
        else:
            default = setting.default_for(route)
            values[name] = default if default is None else setting.parse(default, name)
            sources[name] = "default"
    return Resolved(route, values, sources)


def set_in_environment(readers, environ=None):
    """{variable: text} of the set variables of the settings read by ``readers`` (each
    then counts as read: its reader acts on it, or stops the run)."""
    environ = os.environ if environ is None else environ
    found = {s.env: environ[s.env] for s in SETTINGS
             if set(s.readers) & set(readers) and str(environ.get(s.env, "")).strip() != ""}
    READ.update(found)
    return found


# The variables some route has read in this process (``resolve``, ``set_in_environment``).
READ = set()


def unread(environ=None):
    """{variable: text} of the set variables no route read: a plain script that sets
    CORE_OPS_MESSAGE_SIZE but wraps its model itself, say. core_ops' own (CORE) are read
    at import and at the build."""
    environ = os.environ if environ is None else environ
    return {s.env: environ[s.env] for s in SETTINGS
            if CORE not in s.readers and s.env not in READ and str(environ.get(s.env, "")).strip() != ""}


def say_unread():
    """At exit, on rank 0: the set variables nothing read, and who reads them. The
    routes that can stop a run (the plugins, amp) do so at once; this catches the rest."""
    left = unread()
    if left and os.environ.get("RANK", "0") == "0":
        import sys
        for env, text in left.items():
            who = ", ".join(READERS[r] for r in BY_ENV[env].readers)
            print(f"core-ops: {env}={text!r} was set, but nothing in this run read it (it is read by {who}: "
                  "docs/settings.md)", file=sys.stderr, flush=True)


def describe(resolved, names_=None):
    """One line of every effective setting of ``resolved`` (all of its route's), with
    where the non-default ones came from: what the "active" lines print."""
    shown = []
    for name in names_ or resolved.values:
        value = resolved.values[name]
        text = str(value).removeprefix("torch.") if value is not None else "None"
        source = resolved.sources[name]
        shown.append(f"{name}={text}" + (f" ({source})" if source.startswith("CORE_OPS_") else ""))
    return ", ".join(shown)


def markdown_table():
    """docs/settings.md's table, made from SETTINGS."""
    rows = ["| variable | argument | read by | default (the plugins') | off / never | meaning |",
            "|---|---|---|---|---|---|"]
    for s in SETTINGS:
        default = "unset" if s.default is None else str(s.default)
        if s.plugin_default is not _UNSET:
            default += f" ({s.plugin_default})"
        readers = ", ".join(READERS[r] for r in s.readers)
        rows.append(f"| `{s.env}` | `{s.name}` | {readers} | {default} | {s.off} | {s.doc} |")
    return "\n".join(rows) + "\n"


def report(environ=None):
    """[(variable, value or 'unset', where it is read)] for ``python -m core_ops info``."""
    environ = os.environ if environ is None else environ
    return [(s.env, environ.get(s.env, "unset"), ", ".join(READERS[r] for r in s.readers)) for s in SETTINGS]


def check_environment(environ=None):
    """Raises BadEnvironment naming each unknown ``CORE_OPS_*`` variable, the closest
    valid name and the whole list, or a bad value of a variable core_ops reads itself."""
    environ = os.environ if environ is None else environ
    for setting in SETTINGS:
        if CORE in setting.readers and setting.env in environ and environ[setting.env].strip():
            try:
                setting.parse(environ[setting.env], setting.env)
            except ValueError as e:
                raise BadEnvironment(f"{e} ({setting.doc})") from None
    unknown = sorted(k for k in environ if k.startswith("CORE_OPS_") and k not in BY_ENV)
    if not unknown:
        return
    hints = []
    for name in unknown:
        # Compared without the shared prefix, which would make every name look close.
        close = difflib.get_close_matches(name[len("CORE_OPS_"):], [k[len("CORE_OPS_"):] for k in BY_ENV], n=1,
                                          cutoff=0.7)
        hints.append(f"{name}" + (f" (did you mean CORE_OPS_{close[0]}?)" if close else ""))
    by_reader = {}
    for setting in SETTINGS:
        by_reader.setdefault(setting.readers[0], []).append(setting.env)
    readers = "; ".join(f"{who}: {', '.join(sorted(envs))}" for who, envs in by_reader.items())
    raise BadEnvironment(f"unknown environment variable{'s' if len(unknown) > 1 else ''} {', '.join(hints)}; "
                         f"core-ops reads ({readers}; docs/settings.md)")
