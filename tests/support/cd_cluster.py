"""ComputeDomains in the real control plane, several simulated GB200 trays on one machine.

Each :class:`CdNode` is a Ready Node served by ``dradriver run --compute-domains true`` (both DRA drivers) with
a :class:`PodRunner`: the kubelet's part for pods bound to the node. It prepares their claims with every driver
they name (retrying as the kubelet does), applies the CDI edits it gets back to a record of the container, and
for the IMEX daemon pods of the domain DaemonSets runs the container command as a local process (its /imexd
mount mapped to the host directory, its pod IP the node's own loopback address); it restarts that process when
it exits, reports pods Running, and on deletion stops the process, unprepares and removes the pod.

The node plugin, the daemons and the controller run with tokens of the chart's service accounts
(:func:`account_kubeconfig`), never as admin: a rule missing from the chart's RBAC fails the tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dradriver.computedomain import api
from dradriver.plugin.kubeletplugin.kubelet_client import Claim, KubeletClient
from dradriver.sim import imex_standin
from support.cluster_node import DriverRun, KubeletStandIn, SimNode
from support.cluster_pods import kubectl
from support.control_plane import ControlPlane, NodeKeeper, write_kubeconfig
from support.helm import CHART, run_helm, template
from support.kube_rest import ApiError, Kube

NAMESPACE = "dradriver"
GPU_DRIVER = "gpu.dradriver.dev"
REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "deployments/helm/dradriver/crds"


def chart_parts() -> list[dict[str, Any]]:
    """What the ComputeDomain tests take of the chart (release dradriver, namespace dradriver): every service account
    and RBAC object (each component runs on its own account's token) and the ComputeDomain DeviceClasses; the
    components themselves run as processes."""
    return [
        o for o in template("--set", "computeDomains.enabled=true")
        if o["kind"] in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount")
        or (o["kind"] == "DeviceClass" and "compute-domain" in o["metadata"]["name"])
    ]  # fmt: skip


def install_chart_parts(plane: ControlPlane) -> Path:
    """The CRDs (Established) and :func:`chart_parts` in the namespace NAMESPACE; the rendered file returned
    (``kubectl delete -f`` it to remove them again)."""

    def run(*args: str) -> None:
        done = subprocess.run([kubectl(), "--kubeconfig", str(plane.kubeconfig), *args], capture_output=True,
                              text=True, timeout=120, check=False)  # fmt: skip
        assert done.returncode == 0, f"kubectl {' '.join(args)}:\n{done.stdout}{done.stderr}"

    kube = plane.kube
    run("apply", "--server-side", "-f", str(CRDS))
    rendered = plane.root / "computedomain-chart.yaml"
    rendered.write_text(yaml.safe_dump_all(chart_parts()))
    run("wait", "--for=condition=Established", "crd/computedomains.resource.dradriver.dev",
        "crd/computedomaincliques.resource.dradriver.dev")  # fmt: skip
    if kube.find("namespaces", NAMESPACE) is None:
        kube.create("namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    kube.wait(
        "the dradriver namespace's default ServiceAccount", lambda: kube.find("serviceaccounts", "default", NAMESPACE)
    )
    run("apply", "--server-side", "--force-conflicts", "-f", str(rendered))
    for account in (PLUGIN_ACCOUNT, DAEMON_ACCOUNT, CONTROLLER_ACCOUNT):
        kube.wait(f"service account {account}", lambda a=account: kube.find("serviceaccounts", a, NAMESPACE))
    return rendered


def nvidia_chart_parts(release: str, namespace: str) -> list[dict[str, Any]]:
    """What ``compat: nvidia`` renders for ComputeDomains, in a release and namespace of its own (so nothing of
    :func:`chart_parts`' is replaced): NVIDIA's CRDs first, then the service accounts, the RBAC of
    resource.nvidia.com and NVIDIA's ComputeDomain DeviceClasses."""
    done = run_helm("template", release, str(CHART), "--namespace", namespace,
                    "--set", "computeDomains.enabled=true", "--set", "compat=nvidia")  # fmt: skip
    assert done.returncode == 0, done.stderr
    rendered = [d for d in yaml.safe_load_all(done.stdout) if d]
    crds = [o for o in rendered if o["kind"] == "CustomResourceDefinition"]
    rest = [
        o for o in rendered
        if o["kind"] in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount")
        or (o["kind"] == "DeviceClass" and "compute-domain" in o["metadata"]["name"])
    ]  # fmt: skip
    return crds + rest


def install_nvidia_chart_parts(plane: ControlPlane, release: str, namespace: str) -> Path:
    """:func:`nvidia_chart_parts` applied (the CRDs Established), in ``namespace`` (made if missing); the rendered
    file returned (``kubectl delete -f`` it to remove them again)."""

    def run(*args: str) -> None:
        done = subprocess.run([kubectl(), "--kubeconfig", str(plane.kubeconfig), *args], capture_output=True,
                              text=True, timeout=120, check=False)  # fmt: skip
        assert done.returncode == 0, f"kubectl {' '.join(args)}:\n{done.stdout}{done.stderr}"

    kube = plane.kube
    parts = nvidia_chart_parts(release, namespace)
    crds = plane.root / f"{release}-crds.yaml"
    crds.write_text(yaml.safe_dump_all([o for o in parts if o["kind"] == "CustomResourceDefinition"]))
    run("apply", "--server-side", "-f", str(crds))
    run("wait", "--for=condition=Established", "crd/computedomains.resource.nvidia.com",
        "crd/computedomaincliques.resource.nvidia.com")  # fmt: skip
    if kube.find("namespaces", namespace) is None:
        kube.create("namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    kube.wait(f"the {namespace} namespace's default ServiceAccount", lambda: kube.find("serviceaccounts", "default",
                                                                                       namespace))  # fmt: skip
    rendered = plane.root / f"{release}-chart.yaml"
    rendered.write_text(yaml.safe_dump_all(parts))
    run("apply", "--server-side", "--force-conflicts", "-f", str(rendered))
    for account in (o["metadata"]["name"] for o in parts if o["kind"] == "ServiceAccount"):
        kube.wait(f"service account {account}", lambda a=account: kube.find("serviceaccounts", a, namespace))
    return rendered


# The chart's service accounts (release dradriver).
PLUGIN_ACCOUNT = "dradriver-kubelet-plugin"
DAEMON_ACCOUNT = "dradriver-compute-domain-daemon"
CONTROLLER_ACCOUNT = "dradriver-compute-domain-controller"


def account_kubeconfig(plane: ControlPlane, account: str, path: Path, pod: dict[str, Any] | None = None) -> Path:
    """A kubeconfig with a token of the chart's service account ``account`` (TokenRequest API), bound to ``pod``
    when given (the token then names the pod's node, as the own-node slice policy wants)."""
    token = account_token(plane.kube, NAMESPACE, account, pod, expiration_s=4 * 3600)
    return write_kubeconfig(path, plane.server, plane.pki.ca_cert, token=token)


def account_token(
    kube: Kube, namespace: str, account: str, pod: dict[str, Any] | None = None, *, expiration_s: int
) -> str:
    """A token of service account ``namespace/account`` from the TokenRequest API, bound to ``pod`` when given (the
    token then names the pod's node, as the node authorizer and the own-node policies want)."""
    spec: dict[str, Any] = {"expirationSeconds": expiration_s}
    if pod is not None:
        meta = pod["metadata"]
        spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    token: str = kube.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", request)[
        "status"
    ]["token"]
    return token


def refusals(log: str) -> list[str]:
    """The lines of a component's log where the API server refused it (an RBAC rule missing)."""
    return [line for line in log.splitlines() if "HTTP 403" in line or "forbidden" in line.lower()]


@dataclass
class Container:
    """What the runtime would have made of a pod's CDI edits."""

    env: dict[str, str] = field(default_factory=dict)
    device_nodes: list[dict[str, Any]] = field(default_factory=list)
    mounts: dict[str, str] = field(default_factory=dict)  # container path -> host path


@dataclass
class RunningPod:
    name: str
    namespace: str
    uid: str
    claims: dict[str, list[Claim]]  # driver -> its claims
    container: Container
    process: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    starts: int = 0


class PodRunner:
    def __init__(self, kube: Kube, kubeconfig: Path, node: SimNode, ip: str) -> None:
        self.kube = kube
        self.kubeconfig = kubeconfig  # the daemon pods' (their service account's token)
        self.node = node
        self.ip = ip
        self.hosts = node.root / "hosts"
        self.hosts.write_text(f"127.0.0.1\tlocalhost\n{ip}\t{node.name}\n")
        self.client = KubeletClient(node.root / "registry")
        self.pods: dict[str, RunningPod] = {}
        self.errors: dict[str, str] = {}  # pod uid -> last prepare error
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"pods-{node.name}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.3):
            try:
                self._pass()
            except (ApiError, OSError) as err:
                self.errors["_loop"] = str(err)

    def _pass(self) -> None:
        bound = {
            p["metadata"]["uid"]: p for p in self.kube.list("pods", fieldSelector=f"spec.nodeName={self.node.name}")
        }
        for uid, running in list(self.pods.items()):
            pod = bound.get(uid)
            if pod is None or pod["metadata"].get("deletionTimestamp"):
                self._end(running)
            elif running.process is not None and running.process.poll() is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(running.process.pid, signal.SIGKILL)  # the container is gone, all of it
                self._start_daemon(running)  # restartPolicy Always
        for uid, pod in bound.items():
            if uid not in self.pods and not pod["metadata"].get("deletionTimestamp"):
                if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                    continue
                self._admit(pod)

    def _admit(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        claims: dict[str, list[Claim]] = {}
        generated = {
            s["name"]: s.get("resourceClaimName") for s in pod.get("status", {}).get("resourceClaimStatuses") or []
        }
        for entry in pod["spec"].get("resourceClaims") or []:
            name = entry.get("resourceClaimName") or generated.get(entry["name"])
            if not name:
                return
            claim = self.kube.get("resourceclaims", name, meta["namespace"])
            if meta["uid"] not in {r.get("uid") for r in claim.get("status", {}).get("reservedFor") or []}:
                return
            for result in claim["status"]["allocation"]["devices"]["results"]:
                driver_claims = claims.setdefault(result["driver"], [])
                if all(c.uid != claim["metadata"]["uid"] for c in driver_claims):
                    driver_claims.append(Claim(meta["namespace"], name, claim["metadata"]["uid"]))
        container = Container()
        for driver, driver_claims in claims.items():
            with self.client.register(self.client.registry_dir / f"{driver}-reg.sock") as plugin:
                prepared = plugin.prepare(driver_claims)
            for claim in driver_claims:
                result = prepared[claim.uid]
                if result.error:
                    self.errors[meta["uid"]] = result.error
                    return  # the kubelet retries at its next sync
                for device in result.devices:
                    for cdi_id in device["cdi_device_ids"]:
                        self._apply_cdi(cdi_id, container)
        running = RunningPod(meta["name"], meta["namespace"], meta["uid"], claims, container)
        self.errors.pop(meta["uid"], None)
        self.pods[meta["uid"]] = running
        if meta.get("labels", {}).get(api.DOMAIN_LABEL) and meta["namespace"] == NAMESPACE:
            self._start_daemon(running)
        self.kube.patch(
            "pods",
            meta["name"],
            {
                "status": {
                    "phase": "Running",
                    "podIP": self.ip,
                    "podIPs": [{"ip": self.ip}],
                    "conditions": [{"type": "Ready", "status": "True"}],
                }
            },
            meta["namespace"],
            sub="status",
        )

    def _apply_cdi(self, cdi_id: str, container: Container) -> None:
        kind, name = cdi_id.split("=", 1)
        for spec_file in self.node.cdi_dir.glob("*.json"):
            spec = json.loads(spec_file.read_text())
            if spec["kind"] != kind:
                continue
            for device in spec["devices"]:
                if device["name"] == name:
                    edits = device["containerEdits"]
                    container.env.update(e.split("=", 1) for e in edits.get("env", []))
                    container.device_nodes += edits.get("deviceNodes", [])
                    container.mounts.update({m["containerPath"]: m["hostPath"] for m in edits.get("mounts", [])})

    def _start_daemon(self, running: RunningPod) -> None:
        if self._stop.is_set():
            return  # stopping: a process started now would outlive the runner
        env = {
            **os.environ,
            **running.container.env,
            "NODE_NAME": self.node.name,
            "POD_IP": self.ip,
            "POD_NAME": running.name,
            "POD_NAMESPACE": running.namespace,
            "POD_UID": running.uid,
            "IMEX_STANDIN_HOSTS": str(self.hosts),
        }
        running.log = self.node.root / f"daemon-{running.name}.log"
        command = [
            sys.executable, "-m", "dradriver", "cd-daemon", "run",
            "--kubeconfig", str(self.kubeconfig),
            "--config-dir", running.container.mounts.get("/imexd", str(self.node.root / "no-imexd")),
            "--hosts-file", str(self.hosts),
            "--imex-command", shlex.join(imex_standin.command()),
            "--imex-ctl-command", shlex.join(imex_standin.ctl_command()),
            "--host-imex-socket", str(self.node.root / "host-imex.sock"),
        ]  # fmt: skip
        with running.log.open("ab") as out:
            # A session of its own: the container's processes (the daemon and its IMEX child) end together.
            running.process = subprocess.Popen(
                command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        running.starts += 1

    def _end(self, running: RunningPod) -> None:
        if running.process is not None and running.process.poll() is None:
            running.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                running.process.wait(20)
        if running.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(running.process.pid, signal.SIGKILL)  # what the container left, as the runtime does
            running.process.wait(5)
        for driver, claims in running.claims.items():
            with self.client.register(self.client.registry_dir / f"{driver}-reg.sock") as plugin:
                errors = plugin.unprepare(claims)
            if any(errors.values()):
                self.errors[running.uid] = str(errors)
                return  # retried at the next pass
        del self.pods[running.uid]
        with contextlib.suppress(ApiError):
            self.kube.delete("pods", running.name, running.namespace, gracePeriodSeconds="0")

    def crash_daemon(self) -> RunningPod:
        """SIGKILL every process of this node's daemon container, as a container crash does."""
        running = self.daemon()
        assert running is not None and running.process is not None
        os.killpg(running.process.pid, signal.SIGKILL)
        return running

    def daemon(self) -> RunningPod | None:
        return next((p for p in self.pods.values() if p.process is not None), None)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        for running in self.pods.values():
            if running.process is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(running.process.pid, signal.SIGKILL)
                running.process.wait(5)


@dataclass
class CdNode:
    node: SimNode
    runner: PodRunner
    ip: str

    @property
    def name(self) -> str:
        return self.node.name

    @classmethod
    def start(cls, plane: ControlPlane, daemons: Path, root: Path, name: str, *, ip: str, profile: str) -> CdNode:
        """The node, its plugin (both drivers) on the plugin account's token bound to a pod on the node, and a
        pod runner whose daemons use the kubeconfig ``daemons``."""
        kube = plane.kube
        root.mkdir(parents=True, exist_ok=True)
        keeper = NodeKeeper(kube, name)
        holder = kube.find("pods", f"plugin-on-{name}", NAMESPACE) or kube.create(
            "pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"plugin-on-{name}", "namespace": NAMESPACE},
                "spec": {"nodeName": name, "serviceAccountName": PLUGIN_ACCOUNT, "automountServiceAccountToken": False,
                         "containers": [{"name": "plugin", "image": "dradriver:test"}]},
            },
            NAMESPACE,
        )  # fmt: skip
        kubeconfig = account_kubeconfig(plane, PLUGIN_ACCOUNT, root / "plugin.kubeconfig", holder)
        extra = (
            "--compute-domains", "true",
            "--cd-namespace", NAMESPACE,
            "--cd-fabric-interval", "1",
        )  # fmt: skip
        driver = DriverRun(root, name, kubeconfig, profile=profile, mig_mode="none", version="1.35", extra=extra)
        kubelet = KubeletStandIn(kube, name, root / "registry")
        node = SimNode(name, profile, "none", "1.35", root, kubeconfig, keeper, driver, kubelet, extra)
        return cls(node, PodRunner(kube, daemons, node, ip), ip)

    def stop(self) -> None:
        self.runner.stop()
        self.node.stop()


class ControllerRun:
    """``dradriver cd-controller`` as a process."""

    def __init__(
        self, kubeconfig: Path, log: Path, identity: str, *, image: str = "dradriver:test", extra: tuple[str, ...] = ()
    ) -> None:
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "dradriver", "cd-controller",
                    "--kubeconfig", str(kubeconfig),
                    "--namespace", NAMESPACE,
                    "--image", image,
                    "--identity", identity,
                    "--lease-duration", "4",
                    "--interval", "0.5",
                    "--metrics-address", "127.0.0.1:0",  # two replicas on one host: a free port each
                    *extra,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip

    def stop(self, signum: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        self.proc.wait(20)

    def get(self, path: str) -> tuple[int, str]:
        """GET ``path`` from the status endpoint (its port, from the log's last start): status and body."""
        ports = re.findall(r"serving metrics and readiness port=(\d+)", self.log.read_text())
        assert ports, f"the controller logged no status port:\n{self.log.read_text()[-2000:]}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ports[-1]}{path}", timeout=10) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()
