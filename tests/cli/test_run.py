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


def test_a_driver_root_without_libcuda_is_a_start_up_error_naming_the_flags(tmp_path):
    import argparse

    from dradriver.cli.run import driver_root_for
    from dradriver.errors import ConfigError

    (tmp_path / "usr/lib").mkdir(parents=True)
    args = argparse.Namespace(
        driver_root="/run/nvidia/driver",
        container_driver_root=str(tmp_path),
        nvidia_cdi_hook_path="",
        plugin_dir=None,
        driver_name="gpu.dradriver.dev",
    )
    with pytest.raises(ConfigError, match=r"libcuda\.so\.580\.65\.06 .* --driver-root .* --container-driver-root"):
        driver_root_for(args, "580.65.06", simulated=False)


def test_a_simulated_node_gets_a_stub_driver_root_in_its_plugin_directory(tmp_path):
    import argparse

    from dradriver.cli.run import driver_root_for

    args = argparse.Namespace(
        driver_root="/",
        container_driver_root="/driver-root",  # the DaemonSet's setting does not matter on a simulated node
        nvidia_cdi_hook_path="none",
        plugin_dir=str(tmp_path / "plugin"),
        driver_name="gpu.dradriver.dev",
    )
    root = driver_root_for(args, "550.163.01", simulated=True)
    assert str(root.host_root) == str(tmp_path / "plugin/sim-driver-root")
    assert root.libcuda.path.name == "libcuda.so.550.163.01" and root.cdi_hook is None
