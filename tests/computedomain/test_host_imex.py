"""Host-managed IMEX (``--imex-mode hostManaged``, computedomain/host_imex.py): the node plugin hands out channel 0
once the host's IMEX daemon answers READY on its control socket (the simulated daemon as the host's service), labels
no Node (so no daemon per domain is pulled onto it), refuses daemon devices, and withholds the channel with a
retryable error naming the socket while the host's daemon is down."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.fake_rest import FakeRest

from dradriver import faults
from dradriver.computedomain import api
from dradriver.computedomain.fabric import CharDevice
from dradriver.computedomain.host_imex import HostImex
from dradriver.computedomain.node import ComputeDomainDriver, NodeFacts
from dradriver.sim import imex_standin
from tests.computedomain.test_node import CLIQUE, NODE, NODE_PATH, UID, _claim, _spec, node_and_domain


class HostService:
    """The host's nvidia-imex service: the stand-in daemon with its control socket enabled."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.socket = directory / "imex_ctrl.sock"
        nodes = directory / "nodes.cfg"
        nodes.write_text("127.0.0.1\n")
        self.config = directory / "config.cfg"
        self.config.write_text(
            "SERVER_PORT=0\nIMEX_CMD_BIND_INTERFACE_IP=127.0.0.1\nIMEX_CMD_PORT=0\nIMEX_CMD_ENABLED=1\n"
            f"IMEX_CMD_UNIX_DOMAIN_PATH={self.socket}\nIMEX_NODE_CONFIG_FILE={nodes}\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([*imex_standin.command(), "-c", str(self.config)])
        deadline = time.monotonic() + 10
        while not self.socket.exists():
            assert time.monotonic() < deadline, "the host IMEX stand-in did not open its control socket"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


@pytest.fixture
def rest() -> FakeRest:
    return node_and_domain()


@pytest.fixture
def host(tmp_path: Path) -> Iterator[HostService]:
    service = HostService(tmp_path / "host-imex")
    yield service
    service.stop()


def _driver(rest: FakeRest, tmp_path: Path, host: HostService, clique: str = CLIQUE) -> ComputeDomainDriver:
    return ComputeDomainDriver(
        facts=NodeFacts(NODE, clique, 237, CharDevice("/dev/nvidia-caps/nvidia-cap1", 236, 1, 0o400)),
        rest=rest,  # type: ignore[arg-type]
        namespace="dradriver",
        state_dir=tmp_path / "state",
        cdi_dir=tmp_path / "cdi",
        host_imex=HostImex(imex_standin.ctl_command(), str(host.socket)),
    )


def test_the_channel_comes_from_the_host_daemon_and_no_node_is_labelled(
    rest: FakeRest,
    tmp_path: Path,
    host: HostService,
) -> None:
    host.start()
    driver = _driver(rest, tmp_path, host)
    result = driver.prepare_resource_claims([_claim("c1", "channel-0", api.channel_config(UID, "Single"))])["c1"]
    assert result.error is None
    edits = _spec(tmp_path, "c1")["devices"][0]["containerEdits"]
    assert [n["path"] for n in edits["deviceNodes"]] == ["/dev/nvidia-caps-imex-channels/channel0"]
    assert edits["env"] == [f"COMPUTE_DOMAIN_UUID={UID}"]
    assert "labels" not in rest.get(NODE_PATH)["metadata"]  # the domain's DaemonSet is pulled onto no node
    assert driver.unprepare_resource_claims([_claim("c1", "channel-0", {}).ref]) == {"c1": None}
    assert not (tmp_path / "cdi" / f"{api.CDI_VENDOR}-claim_c1.json").exists()


def test_the_channel_waits_for_the_host_daemon(rest: FakeRest, tmp_path: Path, host: HostService) -> None:
    driver = _driver(rest, tmp_path, host)
    claim = _claim("c1", "channel-0", api.channel_config(UID, "Single"))
    error = driver.prepare_resource_claims([claim])["c1"].error
    assert error is not None and "host's IMEX daemon on node tray-a is not READY" in error
    assert f"IMEX_CMD_UNIX_DOMAIN_PATH={host.socket}" in error and "the kubelet retries" in error
    host.start()
    assert driver.prepare_resource_claims([claim])["c1"].error is None  # the kubelet's retry


def test_no_daemon_device_is_prepared_in_host_managed_mode(
    rest: FakeRest,
    tmp_path: Path,
    host: HostService,
) -> None:
    claim = _claim("d1", "daemon-0", api.daemon_config(UID), namespace="dradriver")
    error = _driver(rest, tmp_path, host).prepare_resource_claims([claim])["d1"].error
    assert error is not None and "runs --imex-mode hostManaged" in error


def test_a_node_outside_any_clique_gets_no_channel_device_and_asks_no_daemon(
    rest: FakeRest,
    tmp_path: Path,
    host: HostService,
) -> None:
    driver = _driver(rest, tmp_path, host, clique="")
    result = driver.prepare_resource_claims([_claim("c1", "channel-0", api.channel_config(UID, "Single"))])["c1"]
    assert result.error is None  # the host's daemon is not running: not asked
    assert "deviceNodes" not in _spec(tmp_path, "c1")["devices"][0]["containerEdits"]


class Crash(BaseException):
    """Stands in for SIGKILL: nothing after the point runs, and the driver's memory is thrown away."""


@pytest.mark.parametrize("phase", ["retried", "unprepared"])
def test_a_kill_between_the_record_and_the_cdi_spec_leaves_nothing_once_unprepared(
    rest: FakeRest, tmp_path: Path, host: HostService, phase: str
) -> None:
    host.start()
    claim = _claim("c1", "channel-0", api.channel_config(UID, "Single"))

    def crash(name: str) -> None:
        if name == "cd-channel-recorded":
            raise Crash(name)

    faults.observer = crash
    try:
        with pytest.raises(Crash):
            _driver(rest, tmp_path, host).prepare_resource_claims([claim])
    finally:
        faults.observer = None
    restarted = _driver(rest, tmp_path, host)  # a new process on the same checkpoint and CDI directory
    if phase == "retried":
        assert restarted.prepare_resource_claims([claim])["c1"].error is None  # the kubelet's retry
        assert _spec(tmp_path, "c1")["devices"][0]["containerEdits"]["deviceNodes"]
    assert restarted.unprepare_resource_claims([claim.ref]) == {"c1": None}
    assert restarted.checkpoint.load() == {}
    assert not list((tmp_path / "cdi").glob("*.json"))
    assert "labels" not in rest.get(NODE_PATH)["metadata"]


@pytest.mark.parametrize(("answer", "ready"), [("READY", True), ("NOT_READY", False), ("UNAVAILABLE", False)])
def test_only_an_answer_of_exactly_ready_is_ready(answer: str, ready: bool) -> None:
    state = HostImex(["sh", "-c", f"echo {answer}"]).state()  # -q and --u=… become the script's $0 and $1
    assert state.ready is ready and state.detail == answer
