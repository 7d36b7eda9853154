"""`dradriver run --gpu-backend nvml --fabric-manager-partitions true`: the run assembly opens the host's Fabric
Manager through FM's client library found in the driver root (a stand-in libnvfm compiled from C, see
tests/support/nvfm_standin.py), at the socket or address and with the timeout its flags give, and a node without
the library, without FM's socket or with FM outside shared-NVSwitch mode stops at start saying what to do."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support.nvfm_standin import FmStandin, bound_socket, build
from support.short_dirs import short_dir

from dradriver.cli import run, run_assembly
from dradriver.cli.flags.driver_root import DriverRootOptions
from dradriver.cli.flags.env import resolve_env_values
from dradriver.cli.flags.fabric_manager import FabricManagerOptions
from dradriver.cli.flags.gpus import GpuOptions
from dradriver.cli.main import build_parser
from dradriver.cli.run import DriverProcess
from dradriver.cli.run_assembly import open_fabric_manager
from dradriver.cli.run_options import RunOptions
from dradriver.errors import ConfigError
from dradriver.gpu import nvfm
from dradriver.gpu.fabric_manager import FabricManagerError, FabricManagerNotReady
from dradriver.gpu.nvfm import FabricManagerAddress, NvfmFabricManager
from dradriver.sim.fakelib import simulated_gpulib_on
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile

SOCKET = "run/nvidia-fabricmanager/socket"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("nvfm-build"))


@pytest.fixture
def root(built: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A driver root with FM's client library in it (the stand-in's table and log beside, under fm/)."""
    with short_dir("nvfm-") as directory:  # FM's socket lives below it
        standin = FmStandin(directory / "fm", built, monkeypatch)
        (directory / "usr/lib64").mkdir(parents=True)
        shutil.copyfile(standin.library, directory / "usr/lib64/libnvfm.so.1")
        yield directory


def run_options(*flags: str) -> Any:
    """The groups of `run`'s options the Fabric Manager part reads, parsed from `run`'s command line."""
    args = build_parser(["run"]).parse_args(["run", "--gpu-backend", "nvml", "--fabric-manager-partitions", "true",
                                             *flags])  # fmt: skip
    resolve_env_values(args)
    return SimpleNamespace(
        driver_root=DriverRootOptions.from_args(args), fabric_manager=FabricManagerOptions.from_args(args)
    )


def fm_calls(root: Path) -> list[str]:
    log = root / "fm/fm-calls"
    return log.read_text().splitlines() if log.exists() else []


def test_a_real_node_talks_to_fm_through_the_library_in_the_driver_root(root: Path) -> None:
    options = run_options("--driver-root", str(root), "--fabric-manager-timeout", "2.5")
    with bound_socket(root / SOCKET):
        fm = open_fabric_manager(options, None)
        try:
            assert isinstance(fm, NvfmFabricManager)
            assert fm.library_path == str(root / "usr/lib64/libnvfm.so.1")
            assert fm.address == FabricManagerAddress(str(root / SOCKET), True)
            fm.activate(3)
            assert [p.id for p in fm.supported_partitions() if p.active] == [3]
        finally:
            fm.close()
    assert f"fmConnect unix=1 type=2 address={root / SOCKET} timeout=2500" in fm_calls(root)


def test_the_container_s_mount_of_the_driver_root_is_where_the_library_and_socket_are(root: Path) -> None:
    options = run_options("--driver-root", "/", "--container-driver-root", str(root))
    with bound_socket(root / SOCKET):
        fm = open_fabric_manager(options, None)
        fm.close()  # type: ignore[attr-defined]
    assert fm_calls(root)[1] == f"fmConnect unix=1 type=2 address={root / SOCKET} timeout=1000"


def test_an_address_given_is_used_instead_of_the_socket_under_the_driver_root(root: Path) -> None:
    (root / "fm/fm-table").write_text((root / "fm/fm-table").read_text() + "tcp 127.0.0.1:6666\n")
    fm = open_fabric_manager(run_options("--driver-root", str(root), "--fabric-manager-address", "127.0.0.1"), None)
    fm.close()  # type: ignore[attr-defined]
    assert fm_calls(root)[1] == "fmConnect unix=0 type=1 address=127.0.0.1 timeout=1000"


def test_without_fm_s_library_start_stops_naming_the_package_to_install(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"libnvfm.so.1\) is not in the driver root .*nvidia-fabricmanager-dev"):
        open_fabric_manager(run_options("--driver-root", str(tmp_path)), None)


def test_without_fm_s_socket_start_stops_saying_what_to_start(root: Path) -> None:
    with pytest.raises(FabricManagerError, match=rf"no Fabric Manager socket at {root / SOCKET}: start Fabric Manager"):
        open_fabric_manager(run_options("--driver-root", str(root)), None)
    assert fm_calls(root) == ["fmLibInit", "fmLibShutdown"]


def test_fm_outside_shared_nvswitch_mode_stops_start(root: Path) -> None:
    (root / "fm/fm-table").write_text("not-shared\n")
    with bound_socket(root / SOCKET), pytest.raises(FabricManagerError, match=r"FM_ST_NOT_SUPPORTED.*FABRIC_MODE=1"):
        open_fabric_manager(run_options("--driver-root", str(root)), None)


def test_a_simulated_node_keeps_its_stand_in() -> None:
    stand_in: Any = object()
    assert open_fabric_manager(run_options(), lambda: stand_in) is stand_in


@pytest.mark.parametrize("address", ["run/nvidia-fabricmanager/socket", "127.0.0.1:fm"])
def test_an_address_that_is_neither_a_socket_nor_tcp_is_refused(address: str) -> None:
    with pytest.raises(ConfigError, match=r"--fabric-manager-address: .*neither a unix socket's absolute path"):
        run_options("--fabric-manager-address", address)


def test_the_timeout_must_be_above_zero(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        run_options("--fabric-manager-timeout", "0")
    assert "--fabric-manager-timeout" in capsys.readouterr().err


@pytest.mark.parametrize(("seconds", "accepted"), [("4294967.295", True), ("4294967.296", False), ("-1", False)])
def test_the_timeout_must_fit_fm_s_unsigned_milliseconds(
    capsys: pytest.CaptureFixture[str], seconds: str, accepted: bool
) -> None:
    # fmConnect's timeoutMs is a C unsigned int: 2^32 ms would silently wrap to 0.
    if accepted:
        assert run_options("--fabric-manager-timeout", seconds).fabric_manager.timeout_ms == 2**32 - 1
        return
    with pytest.raises(SystemExit):
        run_options("--fabric-manager-timeout", seconds)
    assert "--fabric-manager-timeout" in capsys.readouterr().err


def test_the_flags_are_read_from_their_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRADRIVER_FABRIC_MANAGER_ADDRESS", "/run/fm.sock")
    monkeypatch.setenv("DRADRIVER_FABRIC_MANAGER_TIMEOUT", "3")
    options = run_options().fabric_manager
    assert options.address == FabricManagerAddress("/run/fm.sock", True) and options.timeout_ms == 3000


# --- start waits for Fabric Manager, and closes its client ---------------------------------------------------------


@pytest.fixture
def nvml_node(root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[DriverProcess]:
    """A `run --gpu-backend nvml --fabric-manager-partitions true` process over a simulated HGX board's NVML (the
    driver's files taken as found), FM's client the real one on the stand-in; looking again at once while it waits."""
    board = SimulatedNode(load_node_profile("hgx-h100-80gb"), node_name="n")
    monkeypatch.setattr(GpuOptions, "open_backend", lambda *_, **__: (simulated_gpulib_on(board), None))
    monkeypatch.setattr(run_assembly, "find_driver_root", lambda *_, **__: root)
    monkeypatch.setattr(run_assembly, "use_driver_tools", lambda *_, **__: None)  # no nvidia-smi in this root
    monkeypatch.setattr(run, "DRIVER_WAIT_INTERVAL", 0.0)
    kubeconfig = root / "kubeconfig"  # read, never used: nothing here talks to an API server
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    args = build_parser(["run"]).parse_args(["run", "--node-name", "n", "--gpu-backend", "nvml",
                                             "--fabric-manager-partitions", "true", "--driver-root", str(root),
                                             "--wait-for-driver", "600", "--kubeconfig", str(kubeconfig)])  # fmt: skip
    resolve_env_values(args)
    yield DriverProcess(RunOptions.from_args(args))


def test_start_waits_while_fm_initialises_then_proceeds_and_closes_fm_s_library_at_the_end(
    root: Path, nvml_node: DriverProcess, caplog: pytest.LogCaptureFixture
) -> None:
    (root / "fm/fm-table").write_text((root / "fm/fm-table").read_text() + "not-ready 2 -8\n")
    with bound_socket(root / SOCKET):
        gpus = nvml_node._wait_for_driver()
    assert gpus is not None and isinstance(gpus.fabric_manager, NvfmFabricManager)
    waits = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for Fabric Manager")]
    assert len(waits) == 2 and "FM_ST_NOT_CONFIGURED" in waits[0]
    assert nvml_node.status.waiting_for is None
    assert fm_calls(root).count("fmGetSupportedFabricPartitions") == 3
    library = gpus.fabric_manager.library_path
    assert nvfm._Library.users(library) == 1
    gpus.close()  # what the run's teardown calls
    assert nvfm._Library.users(library) == 0 and fm_calls(root)[-1] == "fmLibShutdown"


def test_a_start_that_fails_after_fm_opened_closes_its_client(
    root: Path, nvml_node: DriverProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    def missing(*_: Any, **__: Any) -> Path:
        raise ConfigError("no driver files")

    monkeypatch.setattr(run_assembly, "find_driver_root", missing)
    with bound_socket(root / SOCKET), pytest.raises(ConfigError, match="no driver files"):
        nvml_node._wait_for_driver()
    assert fm_calls(root)[-1] == "fmLibShutdown"
    assert nvfm._Library.users(str(root / "usr/lib64/libnvfm.so.1")) == 0


def test_fm_still_not_ready_when_the_wait_ends_stops_start_naming_it(root: Path, nvml_node: DriverProcess) -> None:
    options = nvml_node.options
    nvml_node.options = replace(options, driver_root=replace(options.driver_root, wait_for_driver=0.0))
    with pytest.raises(FabricManagerNotReady, match="no Fabric Manager socket"):
        nvml_node._wait_for_driver()
    assert fm_calls(root) == ["fmLibInit", "fmLibShutdown"]
