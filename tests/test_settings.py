"""Each setting declared once (core_ops/settings.py, Note [One declaration per setting]):
the rule argument > variable > default in every route, the plugins' own defaults, one
"never" (0), errors that name what the user wrote, and the docs table made from it."""

import os
from pathlib import Path

import pytest
import torch

from core_ops import settings
from core_ops.amp import AmpLoop

ROOT = Path(__file__).resolve().parents[1]


def test_an_argument_wins_over_the_variable_which_wins_over_the_default():
    env = {"CORE_OPS_LOSS_SCALE": "128", "CORE_OPS_HALF_DTYPE": "bf16"}
    routed = settings.resolve("amp", dict(opt_level="O2"), env)
    assert routed["opt_level"] == "O2" and routed.sources["opt_level"] == "argument"
    assert routed["loss_scale"] == 128.0 and routed.sources["loss_scale"] == "CORE_OPS_LOSS_SCALE"
    assert routed["half_dtype"] == torch.bfloat16
    assert routed["max_loss_scale"] == settings.MAX_LOSS_SCALE and routed.sources["max_loss_scale"] == "default"
    assert routed.given() == {"opt_level": "O2", "loss_scale": 128.0, "half_dtype": torch.bfloat16}


def test_the_plugins_defaults_differ_from_apexs_only_where_declared():
    amp, lightning, accelerate = (settings.resolve(route, environ={}) for route in ("amp", "lightning", "accelerate"))
    differ = {k for k in amp.values if amp[k] != lightning[k]}
    assert differ == {"opt_level", "skip_nonfinite", "max_consecutive_skips", "skip_report_seconds"}
    assert (amp["opt_level"], lightning["opt_level"]) == ("O1", "O2")
    assert (amp["skip_nonfinite"], lightning["skip_nonfinite"]) == (False, True)
    assert (amp["max_consecutive_skips"], lightning["max_consecutive_skips"]) == (0, 50)
    assert all(accelerate[k] == lightning[k] for k in lightning.values)


@pytest.mark.parametrize("route", ["amp", "lightning", "accelerate"])
def test_zero_means_never_in_every_route_and_none_the_default(route):
    assert settings.resolve(route, dict(max_consecutive_skips=0), {})["max_consecutive_skips"] == 0
    assert settings.resolve(route, {}, {"CORE_OPS_MAX_CONSECUTIVE_SKIPS": "0"})["max_consecutive_skips"] == 0
    default = settings.BY_NAME["max_consecutive_skips"].default_for(route)
    assert settings.resolve(route, dict(max_consecutive_skips=None), {})["max_consecutive_skips"] == default


def test_a_bad_value_names_the_argument_or_the_variable_it_came_from():
    with pytest.raises(ValueError, match="^loss_scale='huge': expected 'dynamic' or a number > 0$"):
        settings.resolve("amp", dict(loss_scale="huge"), {})
    with pytest.raises(ValueError, match="^CORE_OPS_LOSS_SCALE='huge': expected 'dynamic' or a number > 0$"):
        settings.resolve("amp", {}, {"CORE_OPS_LOSS_SCALE": "huge"})
    with pytest.raises(ValueError, match="^CORE_OPS_MESSAGE_SIZE='-3': expected an int > 0$"):
        settings.resolve("accelerate", {}, {"CORE_OPS_MESSAGE_SIZE": "-3"})


def test_an_argument_and_a_variable_that_disagree_stop_naming_both():
    with pytest.raises(ValueError, match="^loss_scale=128 and CORE_OPS_LOSS_SCALE='dynamic' disagree, and the "
                                         "variable would be ignored: give one of them$"):
        settings.resolve("amp", dict(loss_scale=128), {"CORE_OPS_LOSS_SCALE": "dynamic"})
    # The same value spelt two ways is no disagreement.
    assert settings.resolve("amp", dict(half_dtype=torch.bfloat16), {"CORE_OPS_HALF_DTYPE": "bf16"})["half_dtype"] \
        == torch.bfloat16


def test_an_unknown_option_is_named_with_the_closest():
    with pytest.raises(TypeError, match=r"unknown option skip_nonfinit \(did you mean skip_nonfinite\?\)"):
        settings.resolve("amp", dict(skip_nonfinit=True), {})


def test_a_cross_setting_error_names_the_route_and_its_fix(monkeypatch):
    # The code route: arguments and "pass ..."; the variables' route: the variables and "set ...".
    with pytest.raises(ValueError, match="^master_weights='remainder' keeps .* pass half_dtype=torch.bfloat16, or "
                                         "pass master_weights=True for float16$"):
        AmpLoop("O2", master_weights="remainder")
    monkeypatch.setenv("CORE_OPS_MASTER_WEIGHTS", "remainder")
    with pytest.raises(ValueError, match="^CORE_OPS_MASTER_WEIGHTS='remainder' keeps .* set CORE_OPS_HALF_DTYPE=bf16, "
                                         "or set CORE_OPS_MASTER_WEIGHTS=1 for float16$"):
        AmpLoop("O2")


def test_amp_reads_the_variables_it_is_not_given(monkeypatch):
    monkeypatch.setenv("CORE_OPS_HALF_DTYPE", "bf16")
    monkeypatch.setenv("CORE_OPS_SKIP_NONFINITE", "1")
    loop = AmpLoop("O2")
    assert loop.half_dtype == torch.bfloat16 and loop.properties.skip_nonfinite is True


def test_the_docs_table_is_the_declaration():
    text = (ROOT / "docs" / "settings.md").read_text()
    assert settings.markdown_table() in text, "docs/settings.md: paste `python -m core_ops settings --markdown`"
    assert all(f"`{s.env}`" in settings.markdown_table() for s in settings.SETTINGS)


def test_a_variable_no_route_read_is_said_at_exit():
    """A plain script: amp.initialize reads CORE_OPS_LOSS_SCALE; CORE_OPS_MESSAGE_SIZE,
    read by Accelerate and apex-ddp only, is said at exit on rank 0."""
    import os
    import subprocess
    import sys
    code = ("import torch; from core_ops import amp; m = torch.nn.Linear(2, 2); "
            "amp.initialize(m, torch.optim.SGD(m.parameters(), lr=0.1), opt_level='O2', "
            "half_dtype=torch.bfloat16, verbosity=0)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORE_OPS_")}
    env.update(CORE_OPS_LOSS_SCALE="128", CORE_OPS_MESSAGE_SIZE="4096")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    said = [line for line in proc.stderr.splitlines() if line.startswith("core-ops: ")]
    assert said == ["core-ops: CORE_OPS_MESSAGE_SIZE='4096' was set, but nothing in this run read it (it is read "
                    "by Accelerate, apex-ddp: docs/settings.md)"], proc.stderr[-2000:]


def test_patch_sets_the_settings_for_a_block_or_a_function_and_restores_them(monkeypatch):
    monkeypatch.setenv("CORE_OPS_HALF_DTYPE", "fp16")
    monkeypatch.delenv("CORE_OPS_LOSS_SCALE", raising=False)
    with settings.patch(half_dtype=torch.bfloat16, loss_scale=128, skip_nonfinite=True):
        routed = settings.resolve("amp")
        assert (routed["half_dtype"], routed["loss_scale"], routed["skip_nonfinite"]) == (torch.bfloat16, 128.0, True)
        assert routed.sources["half_dtype"] == "CORE_OPS_HALF_DTYPE"  # read as the user's variable would be
        with settings.patch(half_dtype=None):  # None: unset, the route's default
            assert settings.resolve("amp").sources["half_dtype"] == "default"
    assert os.environ["CORE_OPS_HALF_DTYPE"] == "fp16" and "CORE_OPS_LOSS_SCALE" not in os.environ

    @settings.patch(backend="reference")
    def reads():
        return settings.core("backend")
    assert reads() == "reference" and settings.core("backend") == "auto"


def test_patch_refuses_what_the_setting_refuses_before_setting_anything(monkeypatch):
    monkeypatch.delenv("CORE_OPS_OPT_LEVEL", raising=False)
    with pytest.raises(ValueError, match="loss_scale=-1: expected 'dynamic' or a number > 0"):
        with settings.patch(opt_level="O2", loss_scale=-1):
            pass
    assert "CORE_OPS_OPT_LEVEL" not in os.environ
    with pytest.raises(TypeError, match="settings.patch: unknown setting 'opt_levle'"):
        settings.patch(opt_levle="O2").__enter__()
