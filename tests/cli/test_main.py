import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import required

from dradriver import __version__
from dradriver.cli.main import main


def test_version_flag_prints_the_package_version(capsys):
    try:
        main(["--version"])
    except SystemExit as exit_:
        assert exit_.code == 0
    assert __version__ in capsys.readouterr().out


def test_module_runs_as_a_program():
    out = subprocess.run([sys.executable, "-m", "dradriver", "--help"], capture_output=True, text=True, check=True)
    assert "inventory" in out.stdout


def test_help_lists_the_exit_codes(capsys):
    assert main(["--help"]) == 0
    assert "70 internal error" in capsys.readouterr().out


def test_a_bad_flag_is_one_line_and_exit_2(capsys):
    assert main(["inventory", "--mig-mode", "Static"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "dradriver inventory: error: argument --mig-mode: invalid choice: 'Static'" in err


def _crash(*_args, **_kwargs):
    raise RuntimeError("boom\nsecond line")


def test_an_unexpected_exception_is_one_line_and_exit_70(monkeypatch, capsys):
    monkeypatch.setattr("dradriver.cli.inventory.render_table", _crash)
    assert main(["inventory", "--gpu-backend", "sim"]) == 70
    err = capsys.readouterr().err
    assert err == ("dradriver inventory: internal error: RuntimeError: boom; rerun with --debug for the traceback\n")


def test_debug_shows_the_traceback_wherever_it_is_given(monkeypatch, capsys):
    monkeypatch.setattr("dradriver.cli.inventory.render_table", _crash)
    assert main(["inventory", "--gpu-backend", "sim", "--debug"]) == 70
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert err.rstrip().endswith("rerun with --debug for the traceback")


def test_kubectl_plugin_names_itself_and_keeps_the_exit_codes():
    script = Path(sys.executable).parent / "kubectl-dradriver"
    if not script.exists():
        required.need("the console scripts", "the package is not installed in this environment",
                      "pip install -e . (`scripts/test` does)")  # fmt: skip
    out = subprocess.run([script, "sim", "show"], capture_output=True, text=True, env=_env(), check=False)
    assert out.returncode == 2
    assert out.stderr == (
        "kubectl dradriver sim: error: --sim-state is required: the state file the simulated node's driver uses\n"
    )


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRADRIVER_") and k != "NODE_NAME"}
    return {**env, **extra}


@pytest.mark.parametrize(
    "case",
    [
        ("DRADRIVER_MIG_MODE", "Static", ["inventory", "--gpu-backend", "sim"], "choose one of none, static, dynamic"),
        ("DRADRIVER_LOG_FORMAT", "xml", ["run", "--node-name", "n"], "choose one of text, json"),
        ("DRADRIVER_LOG_LEVEL", "loud", ["run", "--node-name", "n"], "choose one of debug, info, warning, error"),
        ("DRADRIVER_RESCAN_INTERVAL", "nan", ["run", "--node-name", "n"], "use 0 (never) or a number of seconds"),
        ("DRADRIVER_RESCAN_INTERVAL", "0.1", ["run", "--node-name", "n"], "use 0 (never) or a number of seconds"),
        ("DRADRIVER_RESCAN_INTERVAL", "soon", ["run", "--node-name", "n"], "'soon' is not a number of seconds"),
        ("DRADRIVER_GPU_BACKEND", "cuda", ["inventory"], "choose one of nvml, sim"),
        ("DRADRIVER_DRIVER_NAME", "GPU", ["inventory", "--gpu-backend", "sim"], "'GPU' is not a valid driver name"),
        ("DRADRIVER_KUBERNETES_VERSION", "1.30", ["inventory", "--gpu-backend", "sim"], "DRA needs 1.32 or newer"),
        ("NODE_NAME", "Node_1", ["demo"], "'Node_1' is not a valid node name"),
        ("DRADRIVER_MPS_DAEMON_WRAPPER", "'x", ["run", "--node-name", "n"], "no closing quotation"),
        ("DRADRIVER_IMEX_COMMAND", "'x", ["cd-daemon", "run"], "no closing quotation"),
    ],
)
def test_environment_variables_are_checked_like_their_flags(monkeypatch, capsys, case):
    var, value, argv, message = case
    for name in list(os.environ):
        if name.startswith("DRADRIVER_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv(var, value)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"environment variable {var}={value!r}" in err
    assert message in err


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["run", "--help"], ["sim", "--help"]])
def test_a_bad_variable_never_breaks_version_or_help(monkeypatch, capsys, argv):
    monkeypatch.setenv("DRADRIVER_MIG_MODE", "Static")
    monkeypatch.setenv("DRADRIVER_RESCAN_INTERVAL", "nan")
    assert main(argv) == 0


def test_a_variable_of_one_subcommand_does_not_break_another(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("DRADRIVER_LOG_FORMAT", "xml")  # only `run` logs
    monkeypatch.setenv("DRADRIVER_RESCAN_INTERVAL", "-5")
    assert main(["sim", "--sim-state", str(tmp_path / "s.json"), "show"]) == 0


def _parsed(argv: list[str]):
    from dradriver.cli.flags.env import resolve_env_values
    from dradriver.cli.main import build_parser

    args = build_parser().parse_args(argv)
    resolve_env_values(args)
    return args


def test_an_empty_variable_is_the_flag_given_empty(monkeypatch):
    """DRADRIVER_METRICS_ADDRESS="" turns the status server off, as --metrics-address "" does."""
    monkeypatch.setenv("DRADRIVER_METRICS_ADDRESS", "")
    assert _parsed(["run", "--node-name", "n"]).metrics_address == ""
    assert _parsed(["run", "--node-name", "n", "--metrics-address", ""]).metrics_address == ""
    monkeypatch.delenv("DRADRIVER_METRICS_ADDRESS")
    assert _parsed(["run", "--node-name", "n"]).metrics_address == ":8080"


def test_an_empty_variable_is_checked_like_the_flag_given_empty(monkeypatch, capsys):
    monkeypatch.setenv("DRADRIVER_MIG_MODE", "")
    assert main(["inventory", "--gpu-backend", "sim"]) == 2
    err = capsys.readouterr().err
    assert "environment variable DRADRIVER_MIG_MODE='' (sets --mig-mode): choose one of none, static, dynamic" in err
    assert main(["inventory", "--gpu-backend", "sim", "--mig-mode", ""]) == 2
    assert "invalid choice: ''" in capsys.readouterr().err
