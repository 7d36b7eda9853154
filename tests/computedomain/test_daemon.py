"""The IMEX daemon supervisor against an in-memory API server and the IMEX stand-in on a loopback address."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.fake_rest import FakeRest

from dradriver.cli.main import main
from dradriver.computedomain import api
from dradriver.computedomain.daemon import DaemonSettings, ImexDaemon, settings_from_env
from dradriver.computedomain.kube import path_of
from dradriver.errors import ConfigError
from dradriver.gpu.backend import simulated_imex_commands

NS = "dradriver"
CLIQUE = "c1.7"
UID = "uid-x"
CLIQUE_PATH = path_of(api.API_VERSION, "computedomaincliques", NS, f"{UID}.{CLIQUE}")
IP = "127.44.0.1"
# Every IMEX stand-in here binds IP:50005 (and 127.44.0.2 for a peer): under xdist two of these tests at once would
# find the port taken, and the daemon would see its IMEX exit and restart it. One worker runs them, one at a time.
pytestmark = pytest.mark.xdist_group("imex-stand-in-127.44")


def _wait(what: str, probe: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


def _entry(rest: FakeRest, node: str) -> dict[str, Any] | None:
    clique = rest.find(CLIQUE_PATH) or {}
    return next((d for d in clique.get("daemons") or [] if d["nodeName"] == node), None)


Running = tuple[FakeRest, ImexDaemon, DaemonSettings, Callable[[], None]]


@pytest.fixture
def running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Running]:
    rest = FakeRest()
    rest.put(path_of("v1", "pods", NS, "daemon-n1"), {"metadata": {"name": "daemon-n1"}})
    imex, ctl = simulated_imex_commands()
    settings = DaemonSettings(
        domain_uid=UID, clique_id=CLIQUE, node_name="n1", pod_ip=IP, pod_name="daemon-n1", pod_uid="pod-uid",
        namespace=NS, config_dir=tmp_path / "imexd", hosts_file=tmp_path / "hosts", imex_command=tuple(imex),
        imex_ctl_command=tuple(ctl), poll=0.05,
    )  # fmt: skip
    (tmp_path / "hosts").write_text("127.0.0.1\tlocalhost\n")
    daemon = ImexDaemon(rest, settings)  # type: ignore[arg-type]
    stop = threading.Event()
    monkeypatch.setenv("IMEX_STANDIN_HOSTS", str(tmp_path / "hosts"))  # the stand-in resolves names there
    thread = threading.Thread(target=daemon.run, args=(stop,), daemon=True)
    thread.start()

    def stopped() -> None:
        stop.set()
        thread.join(20)

    try:
        yield rest, daemon, settings, stopped
    finally:
        stopped()


def _number(rest: FakeRest, **indices: int) -> None:
    body = {"daemons": [{"nodeName": node, "index": index} for node, index in indices.items()]}
    rest.apply(CLIQUE_PATH, body, manager="dradriver-cd-controller")


def _table(settings: DaemonSettings) -> str:
    return subprocess.run(
        [*settings.imex_ctl_command, "-c", str(settings.config_file), "-N"],
        capture_output=True, text=True, timeout=10, check=False,
    ).stdout  # fmt: skip


def test_the_daemon_joins_runs_imex_and_follows_its_peers(running: Running) -> None:
    rest, daemon, settings, _ = running
    joined = _wait("the entry", lambda: _entry(rest, "n1"))
    assert joined == {"nodeName": "n1", "ipAddress": IP, "cliqueID": CLIQUE, "status": "NotReady"}
    assert rest.get(path_of("v1", "pods", NS, "daemon-n1"))["metadata"]["labels"] == {api.CLIQUE_LABEL: CLIQUE}
    assert daemon.process is None  # no index yet: IMEX could not find itself in the node list
    _number(rest, n1=0)
    _wait("Ready", lambda: (_entry(rest, "n1") or {}).get("status") == "Ready")
    hosts = settings.hosts_file.read_text()
    assert f"{IP}\tcompute-domain-daemon-0000" in hosts
    # Every other name of the node list has the sentinel address, which IMEX never dials or lists as a peer.
    assert hosts.count("255.255.255.255\tcompute-domain-daemon-") == api.MAX_NODES_PER_IMEX_DOMAIN - 1
    # Read until it answers: a ctl on a loaded machine may time out once, which is no fault of the daemon.
    _wait("IMEX's table of itself", lambda: _table(settings) == f"0 compute-domain-daemon-0000 {IP} I\n")
    assert (settings.config_dir / "nodes.cfg").read_text().count("\n") == api.MAX_NODES_PER_IMEX_DOMAIN
    assert daemon.process is not None
    first = daemon.process.pid
    # A peer joins: the hosts file names it and IMEX re-reads it (SIGUSR1), without a restart.
    rest.apply(CLIQUE_PATH, {"daemons": [{"nodeName": "n2", "ipAddress": "127.44.0.2", "index": 1}]}, manager="x")
    _wait("the peer in IMEX's table", lambda: "1 compute-domain-daemon-0001 127.44.0.2 N" in _table(settings))
    assert daemon.process.pid == first and daemon.restarts == 0
    # IMEX dies: the daemon starts it again.
    daemon.process.kill()
    _wait("the restart", lambda: daemon.restarts == 1)
    assert daemon.process.pid != first


def test_the_daemon_stops_imex_and_leaves_its_clique_on_stop(running: Running) -> None:
    rest, daemon, _, stop = running
    _wait("the entry", lambda: _entry(rest, "n1"))
    _number(rest, n1=0)
    _wait("Ready", lambda: (_entry(rest, "n1") or {}).get("status") == "Ready")
    process = daemon.process
    assert process is not None
    stop()
    assert process.poll() is not None
    assert _entry(rest, "n1") is None


def test_under_nvidias_names_the_daemon_joins_a_clique_of_nvidias_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DRADRIVER_COMPAT=nvidia (what the controller run --compat nvidia gives its daemons): the clique entry in
    resource.nvidia.com, labelled with NVIDIA's labels, and the pod's clique label NVIDIA's."""
    rest = FakeRest()
    rest.put(path_of("v1", "pods", NS, "daemon-n1"), {"metadata": {"name": "daemon-n1"}})
    imex, ctl = simulated_imex_commands()
    env = {"COMPUTE_DOMAIN_UUID": UID, "CLIQUE_ID": CLIQUE, "NODE_NAME": "n1", "POD_IP": IP, "POD_NAME": "daemon-n1",
           "POD_NAMESPACE": NS, "POD_UID": "pod-uid"}  # fmt: skip
    settings = settings_from_env(
        env, config_dir=tmp_path / "imexd", hosts_file=tmp_path / "hosts", imex_command=imex, imex_ctl_command=ctl,
        names=api.NVIDIA,
    )  # fmt: skip
    (tmp_path / "hosts").write_text("127.0.0.1\tlocalhost\n")
    monkeypatch.setenv("IMEX_STANDIN_HOSTS", str(tmp_path / "hosts"))
    stop = threading.Event()
    thread = threading.Thread(target=ImexDaemon(rest, settings).run, args=(stop,), daemon=True)  # type: ignore[arg-type]
    thread.start()
    try:
        path = path_of(api.NVIDIA.api_version, "computedomaincliques", NS, f"{UID}.{CLIQUE}")
        clique = _wait("the entry in NVIDIA's group", lambda: rest.find(path))
        assert clique["metadata"]["labels"] == {api.NVIDIA.domain_label: UID, api.NVIDIA.clique_label: CLIQUE}
        assert rest.find(CLIQUE_PATH) is None
        labels = rest.get(path_of("v1", "pods", NS, "daemon-n1"))["metadata"]["labels"]
        assert labels == {api.NVIDIA.clique_label: CLIQUE}
    finally:
        stop.set()
        thread.join(20)


def test_settings_need_the_domain_from_the_claim() -> None:
    with pytest.raises(ConfigError, match="COMPUTE_DOMAIN_UUID is not set"):
        settings_from_env(
            {}, config_dir=Path("/imexd"), hosts_file=Path("/etc/hosts"), imex_command=[], imex_ctl_command=[]
        )


def test_the_daemon_refuses_to_run_beside_a_host_imex_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    socket = tmp_path / "imex_ctrl.sock"
    socket.touch()
    env = {"COMPUTE_DOMAIN_UUID": UID, "CLIQUE_ID": CLIQUE, "NODE_NAME": "n1", "POD_NAME": "p", "POD_NAMESPACE": NS,
           "POD_UID": "u", "POD_IP": IP}  # fmt: skip
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(["cd-daemon", "run", "--host-imex-socket", str(socket)]) == 2
    assert "a host nvidia-imex service runs on node n1" in capsys.readouterr().err


def test_a_missing_imex_binary_is_one_line_naming_it_and_the_fix(tmp_path: Path) -> None:
    rest = FakeRest()
    rest.put(path_of("v1", "pods", NS, "daemon-n1"), {"metadata": {"name": "daemon-n1"}})
    _number(rest, n1=0)
    settings = DaemonSettings(
        domain_uid=UID, clique_id=CLIQUE, node_name="n1", pod_ip=IP, pod_name="daemon-n1", pod_uid="pod-uid",
        namespace=NS, config_dir=tmp_path / "imexd", hosts_file=tmp_path / "hosts",
        imex_command=(str(tmp_path / "usr/bin/nvidia-imex"),), imex_ctl_command=("false",), poll=0.05,
    )  # fmt: skip
    with pytest.raises(ConfigError) as raised:
        ImexDaemon(rest, settings).run(threading.Event())  # type: ignore[arg-type]
    message = str(raised.value)
    assert "\n" not in message
    assert f"cannot run the IMEX daemon {tmp_path}/usr/bin/nvidia-imex: No such file or directory" in message
    assert "install NVIDIA's nvidia-imex package of the driver's version on the host" in message
    assert _entry(rest, "n1") is None  # it left the clique on the way out
