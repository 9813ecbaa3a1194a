"""The native libraries a wheel carries, and whether this process can use them.

Note [Prebuilt libraries]: a wheel made by tools/wheel.sh holds, in core_ops/lib/, the
CPU library (every x86-64 level, Note [CPU levels]) and, in a full wheel, the CUDA 13
library (SASS for the archs BUILD.json lists), all built on torch's stable ABI for
torch TARGET and newer (Note [Stable ABI]), with BUILD.json saying so. They are tier 1
of the loading order (_build.ensure): taken when this torch is at least the target,
and for CUDA when torch's CUDA major is the library's; else the JIT cache (tier 2,
built from the same sources in csrc/) and else the torch tier and the reference
(tier 3). They are loaded from the installed package only, never from a cache: the
package's folder is the installer's, as every other file of it. A source install
(pip install ., tools/setup.sh) has no core_ops/lib and builds at first use.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

import torch

from ._cpu_build import release

LIB_DIR = Path(__file__).resolve().parent / "lib"
MANIFEST = LIB_DIR / "BUILD.json"


def manifest() -> dict | None:
    try:
        return json.loads(MANIFEST.read_text())
    except (OSError, ValueError):
        return None


def library(kind: str) -> tuple[Path | None, str]:
    """(the wheel's library for ``kind``, what it is) when this process can load it,
    else (None, why not)."""
    built = manifest()
    if built is None:
        return None, "no prebuilt library in this install (a source install builds at first use)"
    entry = built.get("libraries", {}).get(kind)
    if entry is None:
        return None, f"this wheel has no {kind.upper()} library (a --cpu-only wheel)"
    target = built["torch_target"]
    if release(torch.__version__) < release(target):
        return None, f"torch {torch.__version__} is older than the wheel's libraries (torch >= {target})"
    if platform.machine().lower() not in entry.get("machines", []):
        return None, f"the wheel's library is for {', '.join(entry.get('machines', []))}, not {platform.machine()}"
    if kind == "cuda":
        if torch.version.cuda is None:
            return None, "this torch has no CUDA"
        if torch.version.cuda.split(".")[0] != str(entry["cuda_major"]):
            return None, (f"torch's CUDA is {torch.version.cuda}, the wheel's library is for CUDA "
                          f"{entry['cuda_major']}: built here instead")
    path = LIB_DIR / entry["file"]
    if not path.is_file():
        return None, f"{path} is missing from the install"
    what = f"the wheel's, {path}, built with torch {built['built_with_torch']} for torch >= {target}"
    if kind == "cuda":
        what += f", SASS for sm_{', sm_'.join(entry['sass'])}"
    return path, what
