"""`dradriver run` refuses bad settings with one clear line, before touching anything."""

import logging
import socket
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
    assert "DRA needs 1.32 or newer" in capsys.readouterr().err


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
    err = capsys.readouterr().err
    assert f"--kubeconfig {missing}: no such file" in err and "point --kubeconfig at a readable kubeconfig file" in err


def run_args(tmp_path, *extra: str) -> list[str]:
    """A `run` whose directories all lie under tmp_path, so a test can see that nothing was created."""
    return [
        "run",
        "--node-name",
        "n",
        "--gpu-backend",
        "sim",
        "--registry-dir",
        str(tmp_path / "registry"),
        "--plugin-dir",
        str(tmp_path / "plugin"),
        "--cdi-dir",
        str(tmp_path / "cdi"),
        "--sim-state",
        str(tmp_path / "state.json"),
        "--metrics-address",
        "",
        *extra,
    ]


def test_a_metrics_port_in_use_is_one_line_before_anything_starts(tmp_path, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(run_args(tmp_path, "--metrics-address", f"127.0.0.1:{port}")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"--metrics-address '127.0.0.1:{port}': cannot listen there (Address already in use)" in err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--metrics-address", "8080"), "is not HOST:PORT or :PORT"),
        (("--metrics-address", ":99999"), "with a port from 0 to 65535"),
        (("--metrics-address", "no.such.host.invalid:8080"), "cannot listen there"),
        (("--rescan-interval", "-1"), "argument --rescan-interval: '-1': use 0 (never) or a number of seconds"),
        (("--rescan-interval", "nan"), "'nan': use 0 (never)"),
        (("--rescan-interval", "inf"), "'inf': use 0 (never)"),
        (("--rescan-interval", "0.2"), "'0.2': use 0 (never)"),
        (("--node-name", "Node_A"), "argument --node-name: 'Node_A' is not a valid node name"),
        (("--driver-name", "a" * 64 + ".com"), "is not a valid driver name"),
        (("--registry-dir", "/dev/null"), "--registry-dir /dev/null: /dev/null is not a directory"),
        (("--cdi-dir", "/dev/null/cdi"), "--cdi-dir /dev/null/cdi: /dev/null is not a directory"),
        (("--sim-state", "/"), "--sim-state /: not a regular file"),
        (("--kubeconfig", "/dev/zero"), "--kubeconfig /dev/zero: not a regular file"),
        (("--log-format", "xml"), "argument --log-format: invalid choice: 'xml'"),
        (("--pod-uid", "not_a_uid"), "pod UID 'not_a_uid' is not a Kubernetes UID"),
        # Empty, these named the current directory: a registration the kubelet never sees, CDI specs the runtime
        # never reads (DRADRIVER_REGISTRY_DIR="" and DRADRIVER_CDI_DIR="" give the same values).
        (("--registry-dir", ""), "--registry-dir (DRADRIVER_REGISTRY_DIR) is empty"),
        (("--cdi-dir", ""), "--cdi-dir (DRADRIVER_CDI_DIR) is empty"),
    ],
)
def test_the_whole_configuration_is_checked_before_anything_is_touched(tmp_path, capsys, extra, message):
    assert main(run_args(tmp_path, *extra)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert message in err
    assert not list(tmp_path.iterdir())


def test_a_kubeconfig_that_is_no_mapping_is_named(tmp_path, capsys):
    config = tmp_path / "kubeconfig"
    config.write_text("- a\n- list\n")
    assert main(run_args(tmp_path, "--kubeconfig", str(config))) == 2
    assert f"--kubeconfig {config}: expected one kubeconfig mapping (kind: Config), got a list" in (
        capsys.readouterr().err
    )


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


def test_an_unexpected_rescan_failure_does_not_end_rescanning(caplog):
    import argparse
    import threading
    from types import SimpleNamespace

    from dradriver.cli.run import DriverProcess

    class Flaky(DriverProcess):
        rescans = 0

        def _rescan(self) -> None:
            self.rescans += 1
            if self.rescans == 1:
                self.refresh.set()  # ask for the next pass at once, as a health change would
                raise RuntimeError("NVML wrapper bug")
            self.stop.set()  # the loop survived to a second pass: done

    process = Flaky(argparse.Namespace(node_name="n", mig_mode="none", rescan_interval=0, pod_uid=""))
    process.refresh = threading.Event()
    process.plugin = SimpleNamespace(plugin_dir=None)
    process.driver = SimpleNamespace(check_mps_daemons=lambda: None)
    worker = threading.Thread(target=process._rescan_loop)
    worker.start()
    process.refresh.set()
    worker.join(10)
    assert process.rescans == 2 and not worker.is_alive()
    assert "rescan failed unexpectedly" in caplog.text


def test_the_periodic_mps_check_holds_the_rolling_update_lock(tmp_path):
    """In rolling-update mode the other pod's unprepare (under that lock) stops a claim's daemon; a restart by this
    pod's check at the same moment would bring it back for a claim that is gone, so the check takes the lock too."""
    import argparse
    import fcntl
    import os
    import threading
    from types import SimpleNamespace

    from dradriver.cli.run import DriverProcess
    from dradriver.plugin.kubeletplugin.plugin import SERIALIZE_LOCK_NAME

    held: list[bool] = []

    def check() -> None:
        fd = os.open(tmp_path / SERIALIZE_LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.append(False)
        except BlockingIOError:
            held.append(True)
        finally:
            os.close(fd)
        process.stop.set()

    process = DriverProcess(argparse.Namespace(node_name="n", mig_mode="none", rescan_interval=0, pod_uid="pod-1"))
    process._rescan = lambda: None  # type: ignore[method-assign]
    process.refresh = threading.Event()
    process.plugin = SimpleNamespace(plugin_dir=tmp_path)
    process.driver = SimpleNamespace(check_mps_daemons=check)
    worker = threading.Thread(target=process._rescan_loop)
    worker.start()
    process.refresh.set()
    worker.join(10)
    assert held == [True] and not worker.is_alive()
