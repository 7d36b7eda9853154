"""`dradriver run` refuses bad settings with one clear line, before touching anything."""

import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest

from dradriver.cli.main import main
from dradriver.errors import ConfigError
from dradriver.gpu.nvml import NvmlGpuLib
from dradriver.sim.driver_root import write_stub_driver_root
from dradriver.sim.fakelib import fake_pynvml
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """`run` points the root logger at this test's (captured, soon closed) stderr: put it back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


NOWHERE = "https://127.0.0.1:1"  # a server no test reaches: the runs here end (or wait) before they connect


def write_kubeconfig(path, server: str = NOWHERE):
    """A kubeconfig whose one context points at ``server``."""
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: '{server}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    return path


@pytest.fixture(autouse=True)
def _a_kubeconfig(tmp_path_factory, monkeypatch) -> None:
    """Every `run` here finds a usable kubeconfig through $KUBECONFIG (outside its tmp_path, which the tests
    prove untouched): the checks before and after it are what these tests look at."""
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path_factory.mktemp("kube") / "config")))
    for name in ("DRADRIVER_KUBECONFIG", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)


def test_run_needs_a_node_name(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert main(["run", "--gpu-backend", "sim", "--registry-dir", str(tmp_path)]) == 2
    assert "--node-name (or NODE_NAME) is required" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_run_rejects_a_kubernetes_version_without_dra(capsys):
    assert main(["run", "--node-name", "n", "--gpu-backend", "sim", "--kubernetes-version", "1.30"]) == 2
    assert "DRA needs 1.32 or newer" in capsys.readouterr().err


def test_run_without_nvml_fails_with_one_line(capsys):
    flags = ["--gpu-backend", "nvml", "--wait-for-driver", "0", "--metrics-address", "", "--kubernetes-version", "1.35"]
    assert main(["run", "--node-name", "n", *flags]) == 2
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
        "--kubernetes-version",
        "1.35",
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
        (("--cd-fabric-interval", "nan"), "argument --cd-fabric-interval: 'nan': use 0 (never)"),
        (("--cd-fabric-interval", "-1"), "argument --cd-fabric-interval: '-1': use 0 (never)"),
        (("--cd-ready-timeout", "-1"), "argument --cd-ready-timeout: '-1': use a finite number, 0 or more"),
        (("--cd-ready-timeout", "inf"), "argument --cd-ready-timeout: 'inf': use a finite number, 0 or more"),
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
    from dradriver.cli.flags.driver_root import DriverRootOptions

    (tmp_path / "usr/lib").mkdir(parents=True)
    options = DriverRootOptions(
        driver_root="/run/nvidia/driver", container_driver_root=str(tmp_path), cdi_hook_source="none"
    )
    with pytest.raises(ConfigError, match=r"libcuda\.so\.580\.65\.06 .* --driver-root .* --container-driver-root"):
        options.discover("580.65.06", simulated=False, plugin_dir=tmp_path / "plugin")


def test_a_simulated_node_gets_a_stub_driver_root_in_its_plugin_directory(tmp_path):
    from dradriver.cli.flags.driver_root import DriverRootOptions

    # The DaemonSet's --container-driver-root does not matter on a simulated node.
    options = DriverRootOptions(container_driver_root="/driver-root", nvidia_cdi_hook_path="none")
    root = options.discover("550.163.01", simulated=True, plugin_dir=tmp_path / "plugin")
    assert str(root.host_root) == str(tmp_path / "plugin/sim-driver-root")
    assert root.libcuda.path.name == "libcuda.so.550.163.01" and root.cdi_hook is None


def _root_options(**kwargs):
    from dradriver.cli.flags.driver_root import DriverRootOptions

    return DriverRootOptions(**{"cdi_hook_source": "none", **kwargs})


def test_a_simulated_node_honours_an_explicit_driver_root(tmp_path):
    # Any install layout, e.g. the H100 node's /usr/local/nvidia, runs on the simulated backend when named.
    layout = write_stub_driver_root(tmp_path / "layout", "550.163.01")
    root = _root_options(driver_root=str(layout)).discover("550.163.01", simulated=True, plugin_dir=tmp_path / "plugin")
    assert root.host_root == PurePosixPath(layout)
    assert not (tmp_path / "plugin/sim-driver-root").exists()


def test_the_images_hook_is_copied_to_the_plugin_directory_and_named_in_specs(tmp_path):
    plugin = tmp_path / "plugin"
    shipped = tmp_path / "image/nvidia-cdi-hook"
    shipped.parent.mkdir()
    shipped.write_bytes(b"#!/bin/sh\nexit 0\n")
    copied = plugin / "nvidia-cdi-hook"
    assert _root_options(cdi_hook_source=str(shipped)).cdi_hook(plugin) == str(copied)
    assert copied.read_bytes() == shipped.read_bytes() and os.access(copied, os.X_OK)
    before = copied.stat().st_ino
    assert _root_options(cdi_hook_source=str(shipped)).cdi_hook(plugin) == str(copied)
    assert copied.stat().st_ino == before, "an identical hook is left alone (a runtime may be running it)"
    shipped.write_bytes(b"#!/bin/sh\nexit 1\n")
    _root_options(cdi_hook_source=str(shipped)).cdi_hook(plugin)
    assert copied.read_bytes() == shipped.read_bytes()
    # An explicit host path wins; none turns the hooks off; no source leaves discovery to the driver root.
    given = _root_options(cdi_hook_source=str(shipped), nvidia_cdi_hook_path="/opt/hook")
    assert given.cdi_hook(plugin) == "/opt/hook"
    assert _root_options(nvidia_cdi_hook_path="none").cdi_hook(plugin) is None
    assert _root_options().cdi_hook(plugin) == ""
    with pytest.raises(ConfigError, match="--cdi-hook-source") as err:
        _root_options(cdi_hook_source=str(tmp_path / "missing")).cdi_hook(plugin)
    assert "--nvidia-cdi-hook-path none makes specs without hooks" in str(err.value)


def test_a_node_without_the_driver_yet_waits_alive_but_not_ready_and_stops_on_sigterm(tmp_path):
    from support.control_plane import free_port

    port = free_port()
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "dradriver", *run_args(tmp_path)[:-1], f"127.0.0.1:{port}"),
            *("--gpu-backend", "nvml", "--driver-root", str(tmp_path / "empty-root"), "--cdi-hook-source", "none"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        answers: dict[str, int] = {}
        while time.monotonic() < deadline and len(answers) < 2:
            for path in ("/livez", "/readyz"):
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as reply:
                        answers[path] = reply.status
                except urllib.error.HTTPError as err:
                    answers[path] = err.code
                except OSError:
                    time.sleep(0.05)  # not listening yet: poll again
        assert answers == {"/livez": 200, "/readyz": 503}
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert "waiting for the NVIDIA driver" in err and "NVML" in err


def test_a_driver_root_that_no_install_can_fix_fails_at_once_instead_of_waiting(tmp_path):
    # Waiting is for a driver still being installed; a relative --driver-root stays wrong however long we wait.
    argv = [*run_args(tmp_path), "--driver-root", "run/nvidia/driver", "--cdi-hook-source", "none"]
    command = [sys.executable, "-m", "dradriver", *argv]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--driver-root run/nvidia/driver is not an absolute path" in done.stderr
    assert "waiting for the NVIDIA driver" not in done.stderr


def _node(tmp_path, *, pod_uid=None, **parts):
    """The parts of an assembled node the loops use, as stand-ins."""
    from types import SimpleNamespace

    from dradriver.cli.flags.publishing import PublishingOptions
    from dradriver.cli.flags.sharing import SharingOptions
    from dradriver.cli.run_assembly import serialised_with_other_pods

    options = SimpleNamespace(
        publishing=PublishingOptions(rescan_interval=0),
        sharing=SharingOptions(),
        driver_root=_root_options(),
        dirs=SimpleNamespace(plugin=tmp_path / "plugin", state=tmp_path / "plugin"),
    )
    return SimpleNamespace(
        options=options,
        serialised_with_other_pods=lambda: serialised_with_other_pods(tmp_path, enabled=pod_uid is not None),
        **parts,
    )


def test_an_unexpected_rescan_failure_does_not_end_rescanning(tmp_path, caplog):
    import threading
    from types import SimpleNamespace

    from dradriver.cli.node_loops import Rescanner

    class Flaky(Rescanner):
        rescans = 0

        def rescan(self) -> None:
            self.rescans += 1
            if self.rescans == 1:
                self.refresh.set()  # ask for the next pass at once, as a health change would
                raise RuntimeError("NVML wrapper bug")
            self.stop.set()  # the loop survived to a second pass: done

    rescanner = Flaky(_node(tmp_path, driver=SimpleNamespace(check_mps_daemons=lambda: None)), threading.Event())
    worker = threading.Thread(target=rescanner.run)
    worker.start()
    rescanner.refresh.set()
    worker.join(10)
    assert rescanner.rescans == 2 and not worker.is_alive()
    assert "rescan failed unexpectedly" in caplog.text


def test_the_periodic_mps_check_holds_the_rolling_update_lock(tmp_path):
    """In rolling-update mode the other pod's unprepare (under that lock) stops a claim's daemon; a restart by this
    pod's check at the same moment would bring it back for a claim that is gone, so the check takes the lock too."""
    import fcntl
    import os
    import threading
    from types import SimpleNamespace

    from dradriver.cli.node_loops import Rescanner
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
        rescanner.stop.set()

    node = _node(tmp_path, pod_uid="pod-1", driver=SimpleNamespace(check_mps_daemons=check))
    rescanner = Rescanner(node, threading.Event())
    rescanner.rescan = lambda: None  # type: ignore[method-assign]
    worker = threading.Thread(target=rescanner.run)
    worker.start()
    rescanner.refresh.set()
    worker.join(10)
    assert held == [True] and not worker.is_alive()


def test_an_in_place_driver_upgrade_is_followed_for_new_prepares_naming_claims_on_the_old_files(tmp_path, caplog):
    import threading
    from types import SimpleNamespace

    from dradriver.cli.node_loops import Rescanner

    root = tmp_path / "root"
    write_stub_driver_root(root, "580.65.06")
    node = _node(tmp_path)
    node.options.driver_root = _root_options(driver_root=str(root))
    driver_root = node.options.driver_root.discover("580.65.06", simulated=False, plugin_dir=tmp_path / "plugin")
    lib = NvmlGpuLib(nvml=fake_pynvml(SimulatedNode(load_node_profile("dgx-a100-80gb"))))
    node.gpus = SimpleNamespace(simulated=False, driver_root=driver_root, lib=lib)
    mps_uses: list[dict[str, object]] = []
    node.driver = SimpleNamespace(
        cdi=SimpleNamespace(driver_root=driver_root),
        sharing=SimpleNamespace(mps=SimpleNamespace(use=lambda **commands: mps_uses.append(commands))),
    )
    node.checkpoint = SimpleNamespace(records=lambda: [SimpleNamespace(uid="claim-b"), SimpleNamespace(uid="claim-a")])
    rescanner = Rescanner(node, threading.Event())
    caplog.set_level(logging.INFO)

    rescanner.follow_driver_upgrade("590.10.01")  # NVML says so, but the new files are not there yet
    assert node.gpus.driver_root.version == "580.65.06" and "files are not all there yet" in caplog.text

    write_stub_driver_root(root, "590.10.01")
    rescanner.follow_driver_upgrade("590.10.01")
    assert node.gpus.driver_root.version == "590.10.01"
    assert node.driver.cdi.driver_root is node.gpus.driver_root  # what the next prepare's spec is built from
    assert node.gpus.driver_root.libcuda.path.name == "libcuda.so.590.10.01"
    assert "upgraded in place from 580.65.06 to 590.10.01" in caplog.text and "claims=claim-a,claim-b" in caplog.text
    # New MPS daemons start from the new driver's files too (daemons already serving keep theirs).
    [commands] = mps_uses
    links = Path(commands["env"]["LD_LIBRARY_PATH"])  # type: ignore[index]
    assert (links / "libcuda.so.1").resolve().name == "libcuda.so.590.10.01"
    # And a reset or time-slice runs the new driver's nvidia-smi with its NVML.
    assert lib.nvidia_smi.command == (str(root / "usr/bin/nvidia-smi"),)
    [nvml] = lib.nvidia_smi.preload
    assert nvml.startswith(str(root)) and nvml.endswith("libnvidia-ml.so.590.10.01")


def test_a_wrapped_mps_daemon_is_named_by_its_host_paths(tmp_path):
    # The wrapper runs the daemon in the host's namespaces, where the driver root is at its host path, not where
    # this container mounts it.
    from dradriver.cli.flags.sharing import SharingOptions
    from dradriver.cli.run_assembly import mps_commands
    from dradriver.nvidia_install.driver_root import discover_driver_root
    from dradriver.sim.driver_root import write_stub_driver_root

    mounted = write_stub_driver_root(tmp_path / "driver-root", "580.65.06", machine="x86_64")
    root = discover_driver_root(
        host_root="/run/nvidia/driver", container_root=mounted, version="580.65.06", machine="x86_64"
    )
    wrapped = SharingOptions(
        mps_daemon_wrapper=("nsenter", "--target", "1", "--mount", "--", "systemd-run", "--scope", "--")
    )
    state = tmp_path / "state"
    commands = mps_commands(wrapped, root, simulated=False, state_dir=state)
    # The wrapper apart: the daemon's shm mount namespace goes between it and the daemon (docs/sharing.md).
    assert commands["wrapper"] == ["nsenter", "--target", "1", "--mount", "--", "systemd-run", "--scope", "--"]
    daemon = commands["daemon_command"]
    # Its libraries: links to the host's paths, in the state directory (the same path on the host).
    host_links = state / "driver-libraries/580.65.06-host"
    assert daemon[:2] == ["env", f"LD_LIBRARY_PATH={host_links}"]
    assert (
        os.readlink(host_links / "libcuda.so.1") == "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06"
    )
    # The control daemon starts nvidia-cuda-mps-server for its first client: its own directory goes first on PATH.
    assert daemon[2] == "PATH=/run/nvidia/driver/usr/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert daemon[3] == "/run/nvidia/driver/usr/bin/nvidia-cuda-mps-control"
    assert commands["command"][0].startswith(str(mounted))  # control calls stay in the container
    unwrapped = mps_commands(SharingOptions(), root, simulated=False, state_dir=state)
    # Unwrapped, the daemon runs in this container: the binary's directory where the container mounts the root,
    # on the daemon's PATH alone (on the plugin's own, `unshare` would be the host's, run on this image's loader).
    assert unwrapped["wrapper"] == [] and "PATH" not in unwrapped["env"]
    assert unwrapped["daemon_command"][1].startswith(f"PATH={mounted}/usr/bin:")
    assert unwrapped["daemon_command"][2] == f"{mounted}/usr/bin/nvidia-cuda-mps-control"


def test_the_mps_shm_size_is_a_quantity_of_at_least_one_mebibyte():
    import argparse

    from dradriver.cli.flags.sharing import shm_size

    assert shm_size("64Mi") == 64 * 1024 * 1024 and shm_size("2G") == 2 * 10**9
    for bad in ("", "64", "1Ki", "lots"):
        with pytest.raises(argparse.ArgumentTypeError, match="at least 1Mi"):
            shm_size(bad)


def test_the_compute_domain_flags_name_the_compute_domain_drivers_own_name() -> None:
    # The flags repeat the driver name so that `dradriver run` loads the ComputeDomain modules only when they serve.
    from dradriver.cli.flags import compute_domains
    from dradriver.computedomain import api

    assert compute_domains.DRIVER_NAME == api.DRIVER_NAME


def test_nvidias_device_plugin_socket_on_the_node_is_refused_before_anything_is_touched(tmp_path, capsys):
    plugins = tmp_path / "kubelet/device-plugins"
    plugins.mkdir(parents=True)
    (plugins / "nvidia-gpu.sock").touch()
    assert main(run_args(tmp_path, "--device-plugins-dir", str(plugins))) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"NVIDIA's device plugin is on this node: its kubelet socket {plugins}/nvidia-gpu.sock" in err
    assert "nodeSelector" in err and "--device-plugin-coexistence withhold" in err
    assert [p.name for p in tmp_path.iterdir()] == ["kubelet"] and list(plugins.iterdir()) == [
        plugins / "nvidia-gpu.sock"
    ]


def test_a_node_advertising_nvidia_gpus_is_refused_unless_told_it_is_being_migrated(tmp_path, capsys):
    from types import SimpleNamespace

    from support.apiserver import FakeApiServer

    from dradriver.cli.flags.device_plugin import DevicePluginOptions
    from dradriver.cli.run_assembly import check_device_plugin

    with FakeApiServer() as api:
        api.create("nodes", {"metadata": {"name": "n"}, "status": {"capacity": {"nvidia.com/mig-1g.10gb": "7"}}})
        kubeconfig = str(api.write_kubeconfig(tmp_path.parent / f"{tmp_path.name}-kubeconfig"))
        assert main(run_args(tmp_path, "--kubeconfig", kubeconfig, "--device-plugins-dir", str(tmp_path / "dp"))) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "the Node advertises nvidia.com/mig-1g.10gb: 7" in err
        assert not list(tmp_path.iterdir())
        # Told the node is being migrated, run starts: the check says what it found instead of refusing.
        options = SimpleNamespace(
            node=SimpleNamespace(name="n"),
            device_plugin=DevicePluginOptions(coexistence="withhold", directory=tmp_path / "dp"),
        )
        with_cluster = SimpleNamespace(get_node=lambda name: api.get("nodes", name))
        assert check_device_plugin(options, with_cluster).advertised_gpus == 7


def test_withhold_publishes_no_gpu_while_the_plugin_is_there_and_every_gpu_once_it_is_gone(tmp_path, caplog):
    from types import SimpleNamespace

    from support.nodes import inventory_of

    from dradriver.cli.flags.device_plugin import DevicePluginOptions
    from dradriver.cli.run_assembly import DevicePluginWatch, offered

    inventory = inventory_of("dgx-a100-80gb")
    plugins = tmp_path / "device-plugins"
    plugins.mkdir()
    watch = DevicePluginWatch()
    capacity = {"nvidia.com/gpu": "2"}
    cluster = SimpleNamespace(get_node=lambda name: {"status": {"capacity": capacity}})

    def options(coexistence: str) -> SimpleNamespace:
        plugin = DevicePluginOptions(coexistence=coexistence, directory=plugins)
        return SimpleNamespace(node=SimpleNamespace(name="n"), device_plugin=plugin)

    withheld = offered(options("withhold"), cluster, inventory, watch)
    # It advertises 2 of the node's 8 GPUs, and not which: all are withheld, and the log says so.
    assert withheld.gpus == () and withheld.mig_devices == () and withheld.driver_version == inventory.driver_version
    assert "withholding every GPU" in caplog.text and "2 advertised; which GPUs it holds cannot be told" in caplog.text
    (plugins / "nvidia-gpu.sock").touch()
    capacity.clear()
    assert offered(options("withhold"), cluster, inventory, watch).gpus == ()
    (plugins / "nvidia-gpu.sock").unlink()
    assert offered(options("withhold"), cluster, inventory, watch) is inventory  # gone: every GPU published again


def test_refuse_withholds_every_gpu_with_an_error_when_the_plugin_arrives_while_running(tmp_path, caplog):
    """Refused at start; arrived later, the driver does not exit (prepared pods keep running) but stops offering
    the GPUs at the next rescan, and offers them again once the plugin is gone."""
    from types import SimpleNamespace

    from support.nodes import inventory_of

    from dradriver.cli.flags.device_plugin import DevicePluginOptions
    from dradriver.cli.run_assembly import DevicePluginWatch, offered

    inventory = inventory_of("dgx-a100-80gb")
    plugins = tmp_path / "device-plugins"
    plugins.mkdir()
    watch = DevicePluginWatch()
    cluster = SimpleNamespace(get_node=lambda name: {"status": {"capacity": {}}})
    options = SimpleNamespace(
        node=SimpleNamespace(name="n"), device_plugin=DevicePluginOptions(coexistence="refuse", directory=plugins)
    )
    assert offered(options, cluster, inventory, watch) is inventory
    (plugins / "nvidia-gpu.sock").touch()
    withheld = offered(options, cluster, inventory, watch)
    assert withheld.gpus == () and withheld.mig_devices == ()
    [record] = [r for r in caplog.records if "withholding every GPU" in r.getMessage()]
    assert record.levelname == "ERROR" and f"its kubelet socket {plugins}/nvidia-gpu.sock" in record.getMessage()
    assert "--device-plugin-coexistence withhold" in record.getMessage()  # the fix
    (plugins / "nvidia-gpu.sock").unlink()
    assert offered(options, cluster, inventory, watch) is inventory


@pytest.mark.parametrize("coexistence", ["withhold", "refuse"])
def test_a_node_that_cannot_be_read_is_warned_once_per_error_and_keeps_withheld_gpus_withheld(
    tmp_path, caplog, coexistence
):
    """One failed GET (a 403, a timeout) is no sign the plugin left: GPUs withheld stay withheld until the Node is
    read again; the error is a WARNING once, not at every rescan."""
    from types import SimpleNamespace

    from support.nodes import inventory_of

    from dradriver.cli.flags.device_plugin import DevicePluginOptions
    from dradriver.cli.run_assembly import DevicePluginWatch, check_device_plugin, offered

    inventory = inventory_of("dgx-a100-80gb")
    answers: list[object] = [{"status": {"capacity": {}}}]

    def get_node(name: str) -> object:
        if isinstance(answers[0], Exception):
            raise answers[0]
        return answers[0]

    options = SimpleNamespace(
        node=SimpleNamespace(name="n"),
        device_plugin=DevicePluginOptions(coexistence=coexistence, directory=tmp_path / "dp"),
    )
    cluster = SimpleNamespace(get_node=get_node)
    watch = DevicePluginWatch()
    forbidden = RuntimeError("GET /api/v1/nodes/n: HTTP 403: forbidden")
    answers[0] = forbidden
    assert not check_device_plugin(options, cluster).found  # at start the socket decides, and start goes on
    assert offered(options, cluster, inventory, watch) is inventory  # publishing first: warned
    assert offered(options, cluster, inventory, watch) is inventory  # a rescan: not again
    warned = [r for r in caplog.records if "the Node cannot be read" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelname == "WARNING" and "HTTP 403: forbidden" in warned[0].getMessage()

    answers[0] = {"status": {"capacity": {"nvidia.com/gpu": "8"}}}  # the plugin arrives: withheld
    assert offered(options, cluster, inventory, watch).gpus == ()
    answers[0] = forbidden  # the Node cannot be read again: still withheld, and said so
    assert offered(options, cluster, inventory, watch).gpus == ()
    answers[0] = RuntimeError("GET /api/v1/nodes/n: timed out")
    assert offered(options, cluster, inventory, watch).gpus == ()
    assert offered(options, cluster, inventory, watch).gpus == ()
    # Once per distinct error: the 403, the 403 again after a good read, the timeout; not at the rescans between.
    warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("device plugin check")]
    assert [w.rsplit(": ", 1)[-1] for w in warned] == ["forbidden", "forbidden", "timed out"]
    kept = [r for r in caplog.records if r.getMessage().startswith("keeping every GPU withheld")]
    assert len(kept) == 3 and all(r.levelname == "WARNING" for r in kept)
    answers[0] = {"status": {"capacity": {}}}  # read again, the plugin gone: published
    assert offered(options, cluster, inventory, watch) is inventory


def test_the_coexistence_flag_takes_refuse_or_withhold_and_refuse_is_the_default(tmp_path, capsys, monkeypatch):
    assert main(run_args(tmp_path, "--device-plugin-coexistence", "share")) == 2
    assert "argument --device-plugin-coexistence: invalid choice: 'share'" in capsys.readouterr().err
    monkeypatch.setenv("DRADRIVER_DEVICE_PLUGIN_COEXISTENCE", "both")
    assert main(run_args(tmp_path)) == 2
    assert "DRADRIVER_DEVICE_PLUGIN_COEXISTENCE='both'" in capsys.readouterr().err
    from dradriver.cli.flags.device_plugin import DevicePluginOptions

    assert DevicePluginOptions().coexistence == "refuse"
