"""A simulated GPU node in the real control plane: a Ready Node object, `dradriver run` (sim backend) serving it,
and a kubelet stand-in that calls the plugin for pods the scheduler bound to it."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dradriver.plugin.kubeletplugin.kubelet_client import Claim, KubeletClient, PreparedClaim
from support.control_plane import NodeKeeper
from support.kube_rest import Kube

DRIVER = "gpu.dradriver.dev"
READY_TIMEOUT = 60.0
# Twice Kubernetes' grace period: the driver's own stop budget (25 s) and the teardown after it, on a CI machine
# whose two cores also run a kubelet, containerd and a control plane. Past it the driver counts as hung.
STOP_TIMEOUT = 60.0


class DriverRun:
    """`dradriver run` for one node; ``log`` holds its output (JSON lines)."""

    def __init__(
        self,
        root: Path,
        node: str,
        kubeconfig: Path,
        *,
        profile: str,
        mig_mode: str,
        version: str,
        extra: tuple[str, ...] = (),
        registry_dir: Path | None = None,
        plugin_dir: Path | None = None,
        cdi_dir: Path | None = None,
    ) -> None:
        self.root = root
        self.registry_dir = registry_dir or root / "registry"
        self.plugin_dir = plugin_dir or root / "plugin"
        self.cdi_dir = cdi_dir or root / "cdi"
        self.pod_uid = next((extra[i + 1] for i, arg in enumerate(extra[:-1]) if arg == "--pod-uid"), None)
        self.lines: list[str] = []
        self._ready = threading.Event()
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "dradriver", "run",
                "--node-name", node,
                "--kubeconfig", str(kubeconfig),
                "--gpu-backend", "sim",
                "--sim-profile", profile,
                "--sim-state", str(root / "sim.json"),
                "--mig-mode", mig_mode,
                *(("--kubernetes-version", version) if version else ()),  # none: the driver asks /version
                "--registry-dir", str(self.registry_dir),
                "--plugin-dir", str(self.plugin_dir),
                "--cdi-dir", str(self.cdi_dir),
                "--rescan-interval", "0",
                "--log-format", "json",
                "--metrics-address", "127.0.0.1:0",
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        # Woken by the serving line (its "ready" line waits for a kubelet's registration too), or by the end of the
        # output: a driver that exits closes its stderr a moment before its exit status can be read, so only the
        # line itself says it serves.
        if not self._ready.wait(READY_TIMEOUT) or not self.ready_seen or self.proc.poll() is not None:
            try:
                self.stop()
            except AssertionError as hung:
                raise RuntimeError(f"dradriver run for {node} did not become ready, nor stop: {hung}") from None
            raise RuntimeError(f"dradriver run for {node} did not become ready:\n{self.log}")

    @property
    def ready_seen(self) -> bool:
        return any('"msg": "serving node=' in line for line in self.lines)

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if '"msg": "serving node=' in line:
                self._ready.set()
        self._ready.set()

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def stop(self, signum: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        try:
            code = self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            stacks = self._kill_with_stacks()
            raise AssertionError(f"dradriver run did not stop in {STOP_TIMEOUT:g} s:\n{stacks}") from None
        self._reader.join(10)
        return code

    def _kill_with_stacks(self) -> str:
        """Kill a driver that outlived its stop; its log, ending with every thread's stack (its SIGQUIT dump)."""
        self.proc.send_signal(signal.SIGQUIT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(2)  # time for the dump; the driver goes on running after it
        self.proc.kill()
        self.proc.wait()
        self._reader.join(10)
        return self.log[-20000:]


class KubeletStandIn:
    """What the kubelet's DRA manager does for a pod bound to its node: check each claim is allocated and
    reserved for the pod, then NodePrepareResources (and NodeUnprepareResources when the pod goes)."""

    def __init__(self, kube: Kube, node: str, registry_dir: Path) -> None:
        self.kube = kube
        self.node = node
        self.client = KubeletClient(registry_dir)

    def claims_of(self, pod: dict[str, Any]) -> list[Claim]:
        namespace = pod["metadata"]["namespace"]
        if pod["spec"].get("nodeName") != self.node:
            raise AssertionError(f"pod {pod['metadata']['name']} is bound to {pod['spec'].get('nodeName')!r}")
        generated = {
            s["name"]: s.get("resourceClaimName") for s in pod.get("status", {}).get("resourceClaimStatuses") or []
        }
        claims = []
        for entry in pod["spec"].get("resourceClaims") or []:
            name = entry.get("resourceClaimName") or generated[entry["name"]]
            claim = self.kube.get("resourceclaims", name, namespace)
            reserved = {r.get("uid") for r in claim.get("status", {}).get("reservedFor") or []}
            if pod["metadata"]["uid"] not in reserved:
                raise AssertionError(f"claim {name} is not reserved for pod {pod['metadata']['name']}")
            claims.append(Claim(namespace, name, claim["metadata"]["uid"]))
        return claims

    def prepare(self, pod: dict[str, Any]) -> dict[str, PreparedClaim]:
        claims = self.claims_of(pod)
        with self.client.register() as plugin:
            return plugin.prepare(claims)

    def unprepare(self, claims: list[Claim]) -> dict[str, str]:
        with self.client.register() as plugin:
            return plugin.unprepare(claims)


@dataclass
class SimNode:
    name: str
    profile: str
    mig_mode: str
    version: str
    root: Path
    kubeconfig: Path
    keeper: NodeKeeper
    driver: DriverRun
    kubelet: KubeletStandIn
    extra: tuple[str, ...] = ()  # more flags for `dradriver run`

    @classmethod
    def start(
        cls,
        kube: Kube,
        kubeconfig: Path,
        root: Path,
        name: str,
        *,
        profile: str,
        mig_mode: str,
        version: str = "1.35",
        extra: tuple[str, ...] = (),
    ) -> SimNode:
        root.mkdir(parents=True, exist_ok=True)
        keeper = NodeKeeper(kube, name)
        driver = DriverRun(root, name, kubeconfig, profile=profile, mig_mode=mig_mode, version=version, extra=extra)
        kubelet = KubeletStandIn(kube, name, root / "registry")
        return cls(name, profile, mig_mode, version, root, kubeconfig, keeper, driver, kubelet, extra)

    def restart_driver(self, signum: int = signal.SIGTERM) -> None:
        self.driver.stop(signum)
        self.driver = DriverRun(
            self.root,
            self.name,
            self.kubeconfig,
            profile=self.profile,
            mig_mode=self.mig_mode,
            version=self.version,
            extra=self.extra,
        )

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    def stop(self) -> None:
        try:
            self.driver.stop()
        finally:
            self.keeper.stop()


def remove_nodes(nodes: Iterable[SimNode], kube: Kube, logs: Path) -> None:
    """Stops each node (its driver's log kept as ``logs/dradriver-<node>.log``) and deletes its slices and its Node,
    so that a module's own nodes leave the shared control plane as they found it."""
    failures: list[str] = []
    for node in nodes:  # every node is removed, whichever step fails
        steps = (
            node.stop,
            lambda node=node: (logs / f"dradriver-{node.name}.log").write_text(node.driver.log),
            lambda node=node: kube.delete_all("resourceslices", fieldSelector=f"spec.nodeName={node.name}"),
            lambda node=node: kube.delete("nodes", node.name),
        )
        for step in steps:
            try:
                step()
            except Exception as err:  # reported once every node is gone
                failures.append(f"{node.name}: {err}")
    if failures:
        raise AssertionError("removing the nodes failed:\n" + "\n".join(failures))
