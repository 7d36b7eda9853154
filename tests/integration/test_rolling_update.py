"""A DaemonSet rolling update on one node: two `dradriver run` processes with different pod UIDs serve side by
side, the kubelet stand-in moves to the newest registration, and prepares keep succeeding while the old
process stops."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support.apiserver import FakeApiServer

from dradriver.plugin.kubeletplugin.kubelet_client import Claim, KubeletClient, RegisteredPlugin, discover
from integration.test_run_process import TIMEOUT, DriverProcess, allocated_claim, eventually

OLD_UID = "0f7c3a52-1111-4c1e-9c55-6d1c0a000001"
NEW_UID = "0f7c3a52-2222-4c1e-9c55-6d1c0a000002"


class Kubelet:
    """The part of the kubelet that matters here: it registers every socket that appears and sends each call to
    the most recently registered instance whose sockets are still there (as kubelet 1.33+ does)."""

    def __init__(self, registry: Path) -> None:
        self.client = KubeletClient(registry)
        self.registry = registry
        self.instances: list[tuple[Path, RegisteredPlugin]] = []

    def sync(self) -> None:
        known = {socket for socket, _ in self.instances}
        for socket in discover(self.registry):
            if socket not in known:
                self.instances.append((socket, self.client.register(socket)))
        self.instances = [(s, p) for s, p in self.instances if s.exists() and Path(p.info.endpoint).exists()]

    def newest(self) -> RegisteredPlugin:
        self.sync()
        assert self.instances, "no instance of the driver is registered"
        return self.instances[-1][1]


def test_prepares_keep_succeeding_while_the_old_pod_stops(api: FakeApiServer, root: Path) -> None:
    kubeconfig = api.write_kubeconfig(root / "kubeconfig")
    old = DriverProcess(root, kubeconfig, "--pod-uid", OLD_UID)
    old.wait_ready()
    kubelet = Kubelet(root / "registry")
    claim = allocated_claim(api, "held", ["gpu-0000-07-00-0"])
    first = kubelet.newest().prepare([claim])[claim.uid]
    assert first.error == "", first.error

    outcomes: list[tuple[str, str]] = []  # (endpoint that answered, error)
    stop = threading.Event()

    def kubelet_loop() -> None:
        while not stop.is_set():
            plugin = kubelet.newest()
            try:
                result = plugin.prepare([claim], timeout=10)[claim.uid]
                outcomes.append((plugin.info.endpoint, result.error))
            except Exception as err:  # a gap: the kubelet would fail the pod's prepare
                outcomes.append((plugin.info.endpoint, f"call failed: {err}"))

    loop = threading.Thread(target=kubelet_loop, daemon=True)
    loop.start()
    new = DriverProcess(root, kubeconfig, "--pod-uid", NEW_UID)
    try:
        new.wait_ready()  # the lock let it start beside the old pod
        assert eventually(lambda: any(NEW_UID in endpoint for endpoint, _ in outcomes)), new.log
        assert old.stop(signal.SIGTERM) == 0, old.log
        seen = len(outcomes)
        assert eventually(lambda: len(outcomes) > seen + 20)
    finally:
        stop.set()
        loop.join(TIMEOUT)
    failures = [o for o in outcomes if o[1]]
    assert not failures, failures[:3]
    assert {e for e, _ in outcomes} == {str(root / "plugin" / f"dra-{u}.sock") for u in (OLD_UID, NEW_UID)}
    # Only the new pod's sockets are left, and it still answers with the same devices.
    assert [p.name for p in discover(root / "registry")] == [f"gpu.dradriver.dev-{NEW_UID}-reg.sock"]
    assert kubelet.newest().prepare([claim])[claim.uid] == first
    new.stop()


def test_an_mps_daemon_keeps_serving_through_a_rolling_update_and_a_crash(api: FakeApiServer, root: Path) -> None:
    # The wrapper stands in for the DaemonSet's nsenter/systemd-run: it marks the daemon, then execs it.
    kubeconfig = api.write_kubeconfig(root / "kubeconfig")
    wrapper = ("--mps-daemon-wrapper", "env DRADRIVER_TEST_WRAPPED_DAEMON=1")
    old = DriverProcess(root, kubeconfig, "--pod-uid", OLD_UID, *wrapper)
    old.wait_ready()
    kubelet = Kubelet(root / "registry")
    mps = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
    claim = allocated_claim(api, "mps", ["gpu-0000-07-00-0"], config=mps)
    first = kubelet.newest().prepare([claim])[claim.uid]
    assert first.error == "", first.error
    [identity] = (root / "plugin").rglob("daemon.json")
    pid = json.loads(identity.read_text())["pid"]
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert b"DRADRIVER_TEST_WRAPPED_DAEMON=1" in environ

    def serving() -> bool:
        asked = subprocess.run(
            [sys.executable, "-m", "dradriver.sim.mps_standin"],
            input="get_server_list\n",
            env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(identity.parent / "pipe")},
            capture_output=True, text=True, timeout=TIMEOUT, check=False,
        )  # fmt: skip
        return asked.returncode == 0

    assert serving()
    new = DriverProcess(root, kubeconfig, "--pod-uid", NEW_UID, *wrapper)
    try:
        new.wait_ready()  # the rolling update: the new pod beside the old one
        assert old.stop(signal.SIGKILL) != 0  # the old pod crashes instead of stopping
        assert serving()
        assert kubelet.newest().prepare([claim])[claim.uid] == first  # the new pod re-adopts, starts nothing
        assert json.loads(identity.read_text())["pid"] == pid
        assert (identity.parent / "log" / "control.log").read_text().count("Startup") == 1
        assert kubelet.newest().unprepare([Claim("default", claim.name, claim.uid)]) == {claim.uid: ""}
        assert eventually(lambda: not Path(f"/proc/{pid}").exists() or not serving())
    finally:
        new.stop()


def test_a_second_process_of_the_same_pod_is_refused(api: FakeApiServer, root: Path) -> None:
    kubeconfig = api.write_kubeconfig(root / "kubeconfig")
    first = DriverProcess(root, kubeconfig, "--pod-uid", OLD_UID)
    first.wait_ready()
    try:
        twin = DriverProcess(root, kubeconfig, "--pod-uid", OLD_UID)
        assert twin.proc.wait(TIMEOUT) == 2
        twin.stop()
        assert f"another process of pod {OLD_UID}" in twin.log
        with KubeletClient(root / "registry").register() as plugin:
            assert plugin.unprepare([Claim("default", "x", "uid-x")]) == {"uid-x": ""}
    finally:
        first.stop()


@pytest.mark.parametrize(("server", "slices"), [("v1.34.2", 1), ("v1.36.0", 2)])
def test_the_slice_layout_follows_the_api_server_version(
    api: FakeApiServer, root: Path, server: str, slices: int
) -> None:
    """1.34 keeps a GPU's MIG counter sets inline (one slice); 1.35+ gives them a slice of their own."""
    api.version = {"major": "1", "minor": server.split(".")[1], "gitVersion": server}
    process = DriverProcess(
        root, api.write_kubeconfig(root / "kubeconfig"), "--mig-mode", "dynamic", profile="dgx-a100-40gb"
    )
    try:
        process.wait_ready()
        assert f"detected Kubernetes version={server[1:5]}" in process.log
        ours = lambda: [s for s in api.list("resourceslices") if s["spec"]["driver"] == "gpu.dradriver.dev"]  # noqa: E731
        assert api.wait_until(lambda: len(ours()) == slices, TIMEOUT), (ours(), process.log)
    finally:
        process.stop()
