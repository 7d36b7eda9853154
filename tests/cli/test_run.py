"""`dradriver run` refuses bad settings with one clear line, before touching anything."""

import logging
from collections.abc import Iterator

import pytest

from dradriver.cli.main import main


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """`run` points the root logger at this test's (captured, soon closed) stderr: put it back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_run_needs_a_node_name(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert main(["run", "--gpu-backend", "sim", "--registry-dir", str(tmp_path)]) == 2
    assert "--node-name (or NODE_NAME) is required" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_run_rejects_a_kubernetes_version_without_dra(capsys):
    assert main(["run", "--node-name", "n", "--gpu-backend", "sim", "--kubernetes-version", "1.30"]) == 2
    assert "DRA needs 1.34 or newer" in capsys.readouterr().err


def test_run_without_nvml_fails_with_one_line(capsys):
    assert main(["run", "--node-name", "n", "--gpu-backend", "nvml"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err == "dradriver run: error: nvmlInit: NVML library not found: install the NVIDIA driver or use "
        "--gpu-backend sim"
    )


def test_run_with_an_unreadable_kubeconfig_names_it(capsys, tmp_path):
    missing = tmp_path / "nope"
    assert main(["run", "--node-name", "n", "--gpu-backend", "sim", "--kubeconfig", str(missing)]) == 2
    assert str(missing) in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--health-ignore-xids", "13,x"], "--health-ignore-xids '13,x': 'x' is not an XID number"),
        (["--health-fatal-xids", "1000"], "--health-fatal-xids '1000': XID 1000 is outside 1..999"),
        (["--health-recovery-period", "-5"], "--health-recovery-period -5.0: seconds, 0 or more"),
    ],
)
def test_run_refuses_a_bad_health_policy_with_one_line(capsys, tmp_path, flags, message):
    assert main(["run", "--node-name", "n", "--gpu-backend", "sim", "--registry-dir", str(tmp_path), *flags]) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
