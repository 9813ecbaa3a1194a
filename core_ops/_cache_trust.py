"""Which build cache core_ops may load native libraries from.

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

import os
import stat
import tempfile
import warnings
from pathlib import Path

from . import settings

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
