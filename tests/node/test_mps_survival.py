"""A pod using MPS keeps its control daemon across a driver SIGKILL and a rolling update, on the real kubelet and
containerd, with the driver in the mode the default install runs it: `--mps-daemon-wrapper`, a command that takes
each claim's daemon out of the plugin's container before exec'ing it (docs/sharing.md).

The shipped wrapper is `nsenter --target 1 … -- systemd-run --scope …`: systemd moves the daemon into a scope of
its own, out of the plugin pod's cgroup, which is what the container runtime kills when the plugin dies. This
machine has no systemd and the driver runs as a host process, so the test plays both parts with cgroups of its
own: each driver instance is moved into a "container" cgroup, and its death is the runtime's (SIGKILL to every
process in that cgroup, not just the driver's pid); the wrapper moves the daemon into a "scope" cgroup and then
execs it (so the pid the driver records is the daemon's), as systemd-run --scope does. A daemon left in the
driver's cgroup would die with it; `setsid` alone would not be enough (the driver already starts the daemon in a
session of its own, and a cgroup kill ignores sessions)."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.kube_rest import Kube
from support.mps_daemons import daemon_processes, shm_mounts
from support.node_pods import Workloads, cdi_specs_of, claims_of, running
from support.real_node import RealNode, wait_for

from dradriver.sim import mps_standin
from node.test_pods import GPU_CLASS, NAMESPACE, template, wait_unprepared

CGROUP_ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/pids"))  # cgroup v2, or v1's pids hierarchy
# What the pod's container reports of MPS: the pipe directory's variable and what is in that directory, the
# filesystem on its /dev/shm and what is in it (the daemon's shared memory: the stand-in's marker).
SHOW_MPS = (
    'echo "pipe=$CUDA_MPS_PIPE_DIRECTORY"; ls -a "$CUDA_MPS_PIPE_DIRECTORY" | sed "s/^/entry /"; '
    'awk \'$2 == "/dev/shm" {print "shm-fs " $3 " " $4}\' /proc/mounts; ls -a /dev/shm | sed \'s/^/shm /\''
)


def cgroup_root() -> Path:
    for root in CGROUP_ROOTS:
        if (root / "cgroup.procs").exists() and os.access(root, os.W_OK):
            return root
    pytest.fail(f"no writable cgroup hierarchy at {' or '.join(map(str, CGROUP_ROOTS))}: this test needs root")


@dataclass
class Cgroup:
    """A cgroup of the test's own (the plugin's "container", or the daemons' "scope")."""

    path: Path

    def create(self) -> Cgroup:
        self.path.mkdir(parents=True, exist_ok=True)
        return self

    def pids(self) -> list[int]:
        return [int(pid) for pid in (self.path / "cgroup.procs").read_text().split()]

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def kill(self) -> None:
        """What the runtime does when a container dies: SIGKILL every process in its cgroup."""

        def empty() -> bool:
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return not self.pids()

        wait_for(f"cgroup {self.path} to be empty", empty, 30)

    def remove(self) -> None:
        for child in sorted(self.path.glob("*/"), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                child.rmdir()
        with contextlib.suppress(OSError):
            self.path.rmdir()


def wrapper(scope: Cgroup) -> str:
    """The `--mps-daemon-wrapper` value: into the scope's cgroup, then exec the daemon (its pid unchanged)."""
    script = f'echo $$ > {shlex.quote(str(scope.path / "cgroup.procs"))} && exec "$@"'
    return f"sh -c {shlex.quote(script)} mps-scope"


def mps_template(name: str) -> dict[str, Any]:
    config = {"apiVersion": "gpu.dradriver.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
    return template(name, GPU_CLASS, config=config)


def mps_pod(name: str) -> dict[str, Any]:
    container = {
        "name": "main",
        "image": "busybox:1.36",
        "command": ["sh", "-c", f"{SHOW_MPS}; sleep 3600"],
        "resources": {"claims": [{"name": "gpu"}]},
    }
    spec = {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}], "containers": [container]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


def start_time(pid: int) -> str:
    """The process's start time (field 22 of /proc/<pid>/stat): with the pid, names the process (never a recycled
    pid)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def serving(pipe: Path) -> bool:
    """The daemon of ``pipe`` answers a control call (the stand-in's client, as nvidia-cuda-mps-control's)."""
    done = subprocess.run(
        mps_standin.command(), input="get_server_list\n", capture_output=True, text=True, timeout=30, check=False,
        env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)},
    )  # fmt: skip
    return done.returncode == 0


@dataclass
class Daemon:
    pid: int
    started: str
    pipe: Path


def the_daemon(node: RealNode, uid: str) -> Daemon:
    """The one control daemon serving claim ``uid`` (found among the machine's processes by its pipe
    directory), which must be serving."""
    root = node.plugin_dir / "mps"
    pids = [pid for claim, pid in daemon_processes(root) if claim == uid]
    assert len(pids) == 1, f"claim {uid} should have one MPS control daemon, has pids {pids}"
    daemon = Daemon(pids[0], start_time(pids[0]), root / uid / "pipe")
    assert serving(daemon.pipe), f"the MPS control daemon {daemon.pid} of claim {uid} does not answer"
    return daemon


def container_sees_mps(workloads: Workloads, pod: dict[str, Any], daemon: Daemon) -> str:
    """Inside the pod's container (kubectl exec): the MPS pipe directory's variable, the daemon's socket in the
    directory mounted there, and the daemon's /dev/shm as the container's: a tmpfs (the driver runs as root here,
    so it may mount) holding the marker the daemon wrote into its own /dev/shm. What the container showed."""
    shown = workloads.kubectl("-n", NAMESPACE, "exec", pod["metadata"]["name"], "--", "sh", "-c", SHOW_MPS)
    lines = shown.splitlines()
    assert "pipe=/tmp/nvidia-mps" in lines, shown
    assert f"entry {mps_standin.SOCKET_NAME}" in lines, shown
    # The last /dev/shm mount is the one the container sees: the claim's tmpfs, not the pod's own.
    assert [line for line in lines if line.startswith("shm-fs ")][-1].startswith("shm-fs tmpfs "), shown
    assert f"shm {Path(mps_standin.shm_marker(daemon.pid)).name}" in lines, shown
    return shown


def shares_its_dev_shm(node: RealNode, workloads: Workloads, pod: dict[str, Any], uid: str, daemon: Daemon) -> None:
    """The claim's shm directory is a tmpfs on the node, the daemon's /dev/shm (its marker is there, not in the
    node's own /dev/shm) and the container's (what the container shows is printed, for docs/sharing.md)."""
    shm = node.plugin_dir / "mps" / uid / "shm"
    assert shm_mounts(node.plugin_dir / "mps") == {uid} and os.path.ismount(shm)
    assert Path(mps_standin.shm_marker(daemon.pid, str(shm))).exists()
    assert not Path(mps_standin.shm_marker(daemon.pid)).exists(), "the daemon wrote into the node's /dev/shm"
    print(f"daemon {daemon.pid}, {shm}: {sorted(p.name for p in shm.iterdir())}")
    print(f"kubectl exec {pod['metadata']['name']}:\n{container_sees_mps(workloads, pod, daemon)}")


@pytest.fixture
def cgroups() -> Iterator[tuple[Cgroup, Cgroup]]:
    """The plugin's "container" cgroup (under it one per instance) and the daemons' "scope" cgroup."""
    base = cgroup_root() / f"dradriver-test-{uuid.uuid4().hex[:8]}"
    plugin, scope = Cgroup(base / "plugin").create(), Cgroup(base / "mps").create()
    yield plugin, scope
    for group in (plugin, scope):
        for child in group.path.glob("*/"):
            Cgroup(child).kill()
        group.kill()
    Cgroup(base).remove()


def test_an_mps_pod_keeps_its_daemon_across_a_driver_sigkill_and_a_rolling_update(
    node: RealNode, workloads: Workloads, kube: Kube, cgroups: tuple[Cgroup, Cgroup]
) -> None:
    plugin, scope = cgroups
    outliving = ("--mps-daemon-wrapper", wrapper(scope))
    instances = 0

    def start_in_container(pod_uid: str) -> Any:
        nonlocal instances
        driver = node.start_driver(pod_uid=pod_uid, extra=outliving)  # returns once the kubelet registered it
        instances += 1
        container = Cgroup(plugin.path / f"instance-{instances}").create()
        container.add(driver.proc.pid)
        return driver, container

    name = f"mps-{uuid.uuid4().hex[:6]}"
    docs = [mps_template(name), mps_pod(name)]
    node.stop_driver(node.driver)
    try:
        first, first_container = start_in_container("mps-first")
        workloads.apply(docs)
        [pod] = workloads.wait_running(docs[1])
        [claim] = claims_of(kube, pod)
        uid = claim["metadata"]["uid"]
        daemon = the_daemon(node, uid)
        assert daemon.pid in scope.pids() and daemon.pid not in first_container.pids(), "not moved by the wrapper"
        assert '"msg": "started MPS control daemon' in first.log
        shares_its_dev_shm(node, workloads, pod, uid, daemon)

        def unchanged(after: str) -> None:
            assert the_daemon(node, uid) == daemon, f"the MPS control daemon changed {after}"
            fresh = kube.get("pods", pod["metadata"]["name"], NAMESPACE)
            assert fresh["metadata"]["uid"] == pod["metadata"]["uid"] and running(fresh), fresh.get("status")
            assert [s["restartCount"] for s in fresh["status"]["containerStatuses"]] == [0]
            container_sees_mps(workloads, pod, daemon)

        # The plugin's container dies (a crash, an OOM kill): every process in its cgroup gets SIGKILL.
        first_container.kill()
        assert first.proc.wait(30) == -signal.SIGKILL
        unchanged("when the driver was SIGKILLed")

        # The restarted driver re-adopts the daemon: none started, the same one serving.
        second, _ = start_in_container("mps-second")
        unchanged("when the driver restarted")
        assert "started MPS control daemon" not in second.log

        # A rolling update: the new instance beside the old one, the kubelet moves to it, the old one is stopped.
        third, _ = start_in_container("mps-third")
        node.stop_driver(second)
        unchanged("over a rolling update")
        assert "started MPS control daemon" not in third.log

        # The last pod goes: the kubelet unprepares the claim through the new instance, which stops the daemon.
        workloads.delete(reversed(docs))
        nothing_left(node, kube, claim, daemon)
        assert third.proc.poll() is None
    finally:
        workloads.delete(reversed(docs))
        for driver in node.drivers:
            if driver.proc.poll() is None:
                node.stop_driver(driver)
        node.start_driver()  # the node's default driver, as the other node tests expect it


def nothing_left(node: RealNode, kube: Kube, claim: dict[str, Any], daemon: Daemon) -> None:
    """The claim unprepared (CDI spec gone, status.devices cleared), its daemon exited, its directories gone."""
    uid = claim["metadata"]["uid"]
    wait_unprepared(node, kube, claim)
    wait_for(f"the MPS control daemon {daemon.pid} to exit", lambda: not alive(daemon), 30)
    assert [pid for _, pid in daemon_processes(node.plugin_dir / "mps")] == []
    assert not (node.plugin_dir / "mps" / uid).exists(), "the claim's MPS directories outlived its unprepare"
    assert shm_mounts(node.plugin_dir / "mps") == set(), "the claim's shm tmpfs outlived its unprepare"
    assert cdi_specs_of(node, uid) == []


def alive(daemon: Daemon) -> bool:
    """The daemon's process still runs (not exited, not a zombie nobody reaped: the driver that started it is gone)."""
    try:
        fields = Path(f"/proc/{daemon.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[19] == daemon.started and fields[0] not in ("Z", "X")
