"""Backend 2's cache (Note [Backends] in native/__init__.py): where a library built
here lives, the key it is found by, who may have written it, and the lock that makes
ranks starting together build it once.

Note [Native build]: nothing is compiled at install time. Where the wheel's library is
not taken, the first op called on a device type builds that device's library from
``csrc/`` (compile.py) into a cache folder keyed by everything that changes the binary
(torch and CUDA versions, compiler, flags, CUDA arch list, source hash). A file lock
makes ranks that start together build once while the others wait; later processes only
load the cached library. A library is linked in a staging folder and moved into place
whole, and one cut short is never loaded; a cache that cannot be written (a read-only
image prebuilt with ``python -m core_ops build``) is still read, and so is one built
elsewhere where no compiler or CUDA toolkit is installed (found by a key without the
toolchain, ``PORTABLE_KEY`` beside each library). Any failure (no compiler, no nvcc, a
compile error, no writable cache) leaves the ops on backends 3 and 4, with one warning
that names the cause; ``python -m core_ops info`` shows it again.

Note [A cache no one else writes]: a library in the cache is loaded into the process
(``torch.ops.load_library`` runs its code), and its path is predictable from the cache
key, so whoever can write to a cache folder can plant a ``.so`` that the next user
loads. So cache folders are made 0700, and before anything is loaded from, or built
into, a cache, the cache folder, each folder on the way to the library and the library
itself must be owned by this user (or root) and writable by no one else. A cache that
fails is not used: core_ops builds in a private cache instead and says so once. A team
that shares one cache on purpose opts in with ``CORE_OPS_SHARED_CACHE=1``: other owners
and group-writable folders are then trusted (a folder anyone may write to never is),
and ``python -m core_ops info`` says so.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import sys
import tempfile
import warnings
from pathlib import Path

import torch

from .. import settings
from . import build
from . import toolchain

_SAID = set()


def shared() -> bool:
    """Whether CORE_OPS_SHARED_CACHE=1 opts in to a cache other users write."""
    return settings.core("shared_cache") == "1"


def why_untrusted(path: Path, team: bool | None = None) -> str | None:
    """Why ``path`` (a cache folder or library) must not be trusted, or None."""
    team = shared() if team is None else team
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None  # nothing there yet: it will be made privately (or cannot be: the build says so)
    if stat.S_ISLNK(st.st_mode) and st.st_uid not in (os.getuid(), 0):
        return f"{path} is a link owned by uid {st.st_uid}"
    st = os.stat(path)
    if st.st_uid not in (os.getuid(), 0) and not team:
        return f"{path} is owned by another user (uid {st.st_uid})"
    if st.st_mode & stat.S_IWOTH:
        return f"{path} is writable by every user"
    if st.st_mode & stat.S_IWGRP and not team:
        return f"{path} is writable by its group"
    return None


def why_unsafe(root: Path, path: Path | None = None) -> str | None:
    """Why loading or building ``path`` (a file or folder inside ``root``) is unsafe:
    the first of root, the folders below it on the way, and ``path`` that fails."""
    chain = [root]
    if path is not None:
        relative = path.relative_to(root)
        chain += [root.joinpath(*relative.parts[:i]) for i in range(1, len(relative.parts) + 1)]
    return next((why for p in chain if (why := why_untrusted(p)) is not None), None)


def make_private(folder: Path) -> None:
    """Makes ``folder`` and its missing parents with mode 0700, whatever the umask; an
    existing one is left as it is (why_unsafe judges it)."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for new in reversed(missing):
        try:
            new.mkdir(mode=0o700)
        except FileExistsError:  # another rank made it first: judged as any existing one
            continue
        new.chmod(0o700)


def private_root(default: Path) -> Path:
    """A cache only this user writes: ``<default>-private-<uid>`` when that is safe,
    else a fresh temporary folder (0700)."""
    candidate = default.with_name(f"{default.name}-private-{os.getuid()}")
    try:
        make_private(candidate)
        if why_unsafe(candidate) is None:
            return candidate
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="core_ops-"))


def choose(configured: Path, default: Path, inside: Path | None = None) -> tuple[Path, str | None]:
    """(the cache to use, why ``configured`` was passed over or None), judging the
    folders down to ``inside`` (a library it would load) too. Said once."""
    why = why_unsafe(configured, inside)
    if why is None:
        return configured, None
    root = private_root(default)
    if str(configured) not in _SAID:
        _SAID.add(str(configured))
        warnings.warn(f"core_ops: the build cache {configured} is not used ({why}: another user could plant a "
                      f"library there); building privately in {root}. A team sharing one cache on purpose sets "
                      "CORE_OPS_SHARED_CACHE=1 (Note [A cache no one else writes])", stacklevel=3)
    return root, why


# ---- where: the roots ------------------------------------------------------------------

def default_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "core_ops"


def configured_root() -> Path:
    """The cache the settings name (CORE_OPS_CACHE_DIR, else the user's cache folder)."""
    folder = settings.core("cache_dir")
    return Path(folder).expanduser() if folder else default_root()


def root() -> tuple[Path, str | None]:
    """(the cache used, why ``configured_root()`` was passed over or None)."""
    return choose(configured_root(), default_root())


# ---- what: the key ---------------------------------------------------------------------

PORTABLE_KEY = "PORTABLE_KEY"  # beside a library: its key(toolchain=False)


def _hashed_files(kind: str) -> list[Path]:
    csrc = build.CSRC
    headers = sorted((csrc / "include").rglob("*.h")) + sorted((csrc / kind).glob("*.h"))
    headers += sorted((csrc / kind).glob("*.cuh"))
    return build.sources(kind) + headers


def key(kind: str, arch: str | None = None, toolchain_too: bool = True) -> str:
    """The cache key of ``kind``'s library. ``toolchain_too=False`` leaves out the
    compiler and the CUDA toolkit: the key a prebuilt library is found by where none is
    installed (a slim image run from a cache built elsewhere, Note [Native build])."""
    h = hashlib.sha256()
    parts = [torch.__version__, str(torch.version.cuda)]
    if toolchain_too:
        parts.append(toolchain.version_line([toolchain.cxx() or "c++", "--version"]))
    if kind == "cpu":
        parts += build.hashed_parts([build.host_level()])
    else:
        parts += [f.replace(str(build.CSRC), "<csrc>") for f in build.cuda_flags()] + [toolchain.cuda_archs(arch)]
        if toolchain_too:
            home = toolchain.cuda_home() or ""
            parts += [home, toolchain.version_line([os.path.join(home, "bin", "nvcc"), "--version"])]
    h.update("\0".join(parts).encode())
    for f in _hashed_files(kind):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def library_name(kind: str, arch: str | None = None) -> str:
    return f"core_ops_{kind}_{key(kind, arch)}"


def mark_portable(kind: str, build_dir: Path, arch: str | None) -> None:
    with contextlib.suppress(OSError):
        marker = build_dir / PORTABLE_KEY
        wanted = key(kind, arch, toolchain_too=False)
        if not marker.is_file() or marker.read_text() != wanted:
            marker.write_text(wanted)


def prebuilt(kind: str, arch: str | None) -> Path | None:
    """A complete library in the cache built from these sources, flags and torch by
    any toolchain, for a machine that has none."""
    try:
        wanted = key(kind, arch, toolchain_too=False)
        folder_root, _ = root()
        for folder in sorted(folder_root.glob(f"core_ops_{kind}_*")):
            marker, library = folder / PORTABLE_KEY, folder / f"{folder.name}.so"
            if (marker.is_file() and marker.read_text() == wanted and complete(library)
                    and why_unsafe(folder_root, library) is None):
                return library
    except OSError:
        pass
    return None


# ---- whole, and built once ---------------------------------------------------------------

def complete(library: Path) -> bool:
    """Whether ``library`` is a whole ELF shared object: a file cut short (a build
    killed while linking, a full disk) would crash the process with SIGBUS when
    loaded. The section headers end the file, so a cut file lacks some of them."""
    try:
        with open(library, "rb") as fh:
            head = fh.read(64)
            size = os.fstat(fh.fileno()).st_size
    except OSError:
        return False
    if len(head) < 64 or head[:4] != b"\x7fELF":
        return sys.platform != "linux" and len(head) > 0  # other formats: not checked
    if head[4] != 2:  # 32-bit ELF: torch has no such builds
        return False
    order = "little" if head[5] == 1 else "big"
    shoff = int.from_bytes(head[0x28:0x30], order)
    shentsize = int.from_bytes(head[0x3A:0x3C], order)
    shnum = int.from_bytes(head[0x3C:0x3E], order)
    return shoff + shentsize * shnum <= size


@contextlib.contextmanager
def lock(path: Path):
    """An exclusive lock across processes (ranks of one job); no-op where fcntl is absent."""
    make_private(path.parent)
    with open(path, "a+") as fh:
        try:
            import fcntl
        except ImportError:  # Windows: builds are not shared between ranks there
            yield
            return
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
