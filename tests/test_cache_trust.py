"""Note [A cache no one else writes] (core_ops/native/cache.py): a library, or a folder on
its way inside the cache, that another user owns or that group or others may write is
never loaded; core_ops builds privately instead and says so; a team opts in to a shared
cache with CORE_OPS_SHARED_CACHE=1. Another owner is made with chown (root only)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from core_ops.native import cache

AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file another owner needs root (chown)")
NOBODY = 65534  # another user's uid: no account is needed to own a file


def test_folders_core_ops_makes_are_private(tmp_path):
    old = os.umask(0o022)
    try:
        cache.make_private(tmp_path / "cache" / "core_ops_cpu_x")
    finally:
        os.umask(old)
    for folder in (tmp_path / "cache", tmp_path / "cache" / "core_ops_cpu_x"):
        assert folder.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("mode, why", [(0o770, "is writable by its group"), (0o777, "is writable by every user"),
                                       (0o755, None), (0o700, None)])
def test_a_folder_others_may_write_is_untrusted(tmp_path, mode, why, monkeypatch):
    monkeypatch.delenv("CORE_OPS_SHARED_CACHE", raising=False)
    tmp_path.chmod(mode)
    said = cache.why_untrusted(tmp_path)
    assert said == (None if why is None else f"{tmp_path} {why}")
    # A team's cache: group-writable is trusted, a folder anyone may write never is.
    assert cache.why_untrusted(tmp_path, team=True) == (
        f"{tmp_path} is writable by every user" if mode == 0o777 else None)


@AS_ROOT
def test_another_owner_is_untrusted_unless_the_team_opted_in(tmp_path):
    os.chown(tmp_path, NOBODY, NOBODY)
    assert cache.why_untrusted(tmp_path, team=False) == f"{tmp_path} is owned by another user (uid {NOBODY})"
    assert cache.why_untrusted(tmp_path, team=True) is None


def test_an_unsafe_cache_is_passed_over_for_a_private_one_said_once(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.warns(UserWarning, match=f"the build cache {shared} is not used \\({shared} is writable by every "
                                         "user: another user could plant a library there\\); building privately"):
        root, why = cache.choose(shared, tmp_path / "home" / "core_ops")
    assert why == f"{shared} is writable by every user"
    assert root == tmp_path / "home" / f"core_ops-private-{os.getuid()}"
    assert root.stat().st_mode & 0o777 == 0o700 and cache.why_unsafe(root) is None
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.choose(shared, tmp_path / "home" / "core_ops")[0] == root  # said once


PLANTED = """
import warnings
from core_ops import native
with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always")
    backend = native.ensure("cpu", native.LOOK, warn=False)
print(backend.native, backend.path)
print(" | ".join(str(w.message) for w in said))
"""


@AS_ROOT
def test_a_planted_library_is_never_loaded(tmp_path, jit_cpu_library):
    """The real CPU library, copied into a cache at the path its key gives: loaded when
    this user owns it; owned by another user (planted), refused, and nothing is built
    over it (a look, native.LOOK: the private cache has none yet). On the JIT route, which is the
    one that loads from a cache."""
    name = jit_cpu_library.parent.name
    cache = tmp_path / "cache"
    (cache / name).mkdir(parents=True)
    planted = cache / name / f"{name}.so"
    shutil.copy(jit_cpu_library, planted)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORE_OPS_")}
    env.update(CORE_OPS_CACHE_DIR=str(cache), XDG_CACHE_HOME=str(tmp_path / "home"), CORE_OPS_BACKEND="jit")

    def run():
        proc = subprocess.run([sys.executable, "-c", PLANTED], capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout.splitlines()

    assert run()[0] == f"True {planted}"  # this user's: loaded
    os.chown(planted, NOBODY, NOBODY)
    loaded, said = run()
    assert loaded == "False None"
    assert f"{planted} is owned by another user (uid {NOBODY})" in said and "building privately in" in said
    os.chown(planted, 0, 0)
    (cache / name).chmod(0o777)  # a folder on the way that anyone may write
    loaded, said = run()
    assert loaded == "False None" and f"{cache / name} is writable by every user" in said
    env["CORE_OPS_SHARED_CACHE"] = "1"  # a team's cache still refuses a folder anyone may write
    assert run()[0] == "False None"
    (cache / name).chmod(0o775)
    assert run()[0] == f"True {planted}"  # group-writable, in a team's cache: loaded
