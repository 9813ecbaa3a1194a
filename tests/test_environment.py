"""A mistyped CORE_OPS_* variable stops `import core_ops` with the closest valid name and
the whole list (core_ops/_environment.py), where it used to be ignored without a word."""

import os
import subprocess
import sys

from core_ops import _environment


def test_a_mistyped_variable_is_an_error_naming_the_right_one():
    env = dict(os.environ, CORE_OPS_OPT_LEVLE="O2")
    proc = subprocess.run([sys.executable, "-c", "import core_ops"], capture_output=True, text=True, env=env)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("core_ops.settings.BadEnvironment: unknown environment variable CORE_OPS_OPT_LEVLE (did you mean "
                           "CORE_OPS_OPT_LEVEL?); core-ops reads (core: CORE_OPS_AUTOLOAD, CORE_OPS_BACKEND"), last


def test_known_variables_pass_and_the_list_names_each_reader():
    _environment.check({"CORE_OPS_BACKEND": "auto", "CORE_OPS_SYNC_BN": "1", "PATH": "/bin"})
    try:
        _environment.check({"CORE_OPS_X": "1", "CORE_OPS_Y": "2"})
    except ValueError as e:
        assert str(e).startswith("unknown environment variables CORE_OPS_X, CORE_OPS_Y; core-ops reads")
    else:
        raise AssertionError("unknown names passed")


def test_every_known_name_is_a_declared_setting():
    from core_ops import settings
    assert _environment.KNOWN == {s.env for s in settings.SETTINGS}


def test_a_value_outside_the_fixed_set_is_refused():
    for name in ("CORE_OPS_AUTOLOAD", "CORE_OPS_VERBOSE_BUILD"):
        _environment.check({name: "1"})
        try:
            _environment.check({name: "yes please"})
        except ValueError as e:
            assert str(e).startswith(f"{name}='yes please': expected one of 0, 1 ("), str(e)
        else:
            raise AssertionError(f"{name}='yes please' passed")


def test_a_plugin_installed_without_its_autoload_file_is_named():
    found = {"core_ops_lightning": object(), "core_ops_accelerate": None}.get
    assert _environment.plugins_without_autoload({}, found, {}) == ["core_ops_lightning"]
    assert _environment.plugins_without_autoload({"core_ops_autoload": 1}, found, {}) == []  # its .pth ran
    assert _environment.plugins_without_autoload({}, found, {"CORE_OPS_AUTOLOAD": "0"}) == []  # turned off
    assert _environment.plugins_without_autoload({"core_ops_lightning": 1}, found, {}) == []  # imported already
