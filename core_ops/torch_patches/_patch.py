"""What each module of ``core_ops.torch_patches`` declares, and the one switch that
turns patches off (Note [Patches to torch] in ``__init__.py``)."""

from __future__ import annotations

import dataclasses
import re
import warnings

import torch

from .. import settings

# The modules of this package that reach into torch, by the names the switch takes
# (declared with the switch, in settings.py).
NAMES = settings.PATCH_NAMES
VARIABLE = settings.BY_NAME["torch_patches_off"].env
ISSUE_URL = "https://github.com/pytorch/pytorch/issues/"
_WARNED = set()


def _release(text):
    """(major, minor) of a torch version string ("2.14.1+cu130" -> (2, 14))."""
    found = re.match(r"(\d+)\.(\d+)", str(text))
    if found is None:
        raise ValueError(f"not a torch release: {text!r} (expected 'major.minor', e.g. '2.9')")
    return int(found[1]), int(found[2])


def switched_off(environ=None):
    """The patch names ``CORE_OPS_TORCH_PATCHES_OFF`` lists (``all``: every one).
    Raises BadEnvironment for a name that is not a patch."""
    return settings.patches_off(environ)


@dataclasses.dataclass(frozen=True)
class Patch:
    """One reach into torch's internals. ``torch``: the releases it applies to,
    ``(lowest, first it does not)`` as ``"major.minor"`` (the range pyproject's pin was
    tested over; a release outside it is left unpatched, with a warning). ``upstream``:
    what torch lacks, shown by a script of ``tools/upstream/`` or an issue of
    pytorch/pytorch. ``when_off``: what a run loses when the patch is left out
    (``CORE_OPS_TORCH_PATCHES_OFF=<name>``), and the route that needs no patch."""

    name: str
    torch: tuple[str, str]
    upstream: str
    when_off: str

    def __post_init__(self):
        object.__setattr__(self, "name", self.name.rpartition(".")[2])  # a module's __name__ names its patch
        if self.name not in NAMES:
            raise ValueError(f"Patch name {self.name!r} must be one of {NAMES} (torch_patches._patch.NAMES)")
        if len(self.torch) != 2 or not _release(self.torch[0]) < _release(self.torch[1]):
            raise ValueError(f"Patch {self.name}: torch must be (lowest, first unpatched) releases with "
                             f"lowest < first, got {self.torch!r}")
        if not (re.fullmatch(r"tools/upstream/\w+\.py", self.upstream)
                or re.fullmatch(re.escape(ISSUE_URL) + r"\d+", self.upstream)):
            raise ValueError(f"Patch {self.name}: upstream must be tools/upstream/<script>.py or "
                             f"{ISSUE_URL}<number>, got {self.upstream!r}")
        if not self.when_off.strip():
            raise ValueError(f"Patch {self.name}: when_off must say what is lost with the patch off")

    def applies(self, version=None):
        """Whether torch ``version`` (default: the installed one) is in ``torch``."""
        low, high = (_release(v) for v in self.torch)
        return low <= _release(version or torch.__version__) < high

    def active(self, environ=None):
        """Whether to patch now: not switched off, and this torch within ``torch``
        (outside it, warns once that the patch is left out and what that costs)."""
        if self.name in switched_off(environ):
            return False
        if not self.applies():
            if self.name not in _WARNED:
                _WARNED.add(self.name)
                warnings.warn(f"core_ops leaves torch unpatched by torch_patches.{self.name}: torch "
                              f"{torch.__version__} is outside the releases it was checked on "
                              f"[{self.torch[0]}, {self.torch[1]}). {self.when_off}", RuntimeWarning, stacklevel=3)
            return False
        return True
