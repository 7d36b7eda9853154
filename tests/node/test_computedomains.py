"""ComputeDomains on the real node: the real kubelet and containerd run the IMEX daemon pod (our image) that the
controller's DaemonSet creates, on a simulated GB200 tray, and a workload pod gets its IMEX channel.

Beside the session's driver (which keeps serving ``gpu.dradriver.dev`` on its simulated mixed node), a second
``dradriver run`` serves this node as a GB200 tray under another GPU driver name, with ``--compute-domains true``:
it registers ``compute-domain.dradriver.dev`` with the kubelet. The controller runs as a process (the chart's
controller pod is installed in test_helm_install.py); the daemon pods it creates are real pods: the kubelet
prepares their daemon claim through our plugin, containerd applies the CDI edits (the simulated driver's
``nvidia-imex`` mounted from its stub driver root, ``/imexd``, the fabric-imex-mgmt device), and the daemon's
probes are ``dradriver cd-daemon check`` execs. Daemon pods run in the node's network (this node has no pod
network to the API server: ``--daemon-host-network``, ``--daemon-env``). A one-node domain on the session's node;
two real nodes in one domain: test_computedomains_two_nodes.py. A daemon container SIGKILLed is restarted by the
kubelet and rejoins with its index while the worker keeps running.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.cd_cluster import NAMESPACE, ControllerRun, install_chart_parts
from support.cluster_node import DriverRun
from support.cluster_pods import kubectl
from support.image import VERSION
from support.image import archive as image_archive
from support.node_pods import Workloads, claim_names, running
from support.real_node import RealNode, wait_for

from dradriver.computedomain import api
from dradriver.sim.fabric import IMEX_CHANNELS_MAJOR

IMAGE = f"localhost/dradriver:{VERSION}"
# The tray's GPU driver, under a name of its own so that the session's driver keeps gpu.dradriver.dev.
GPU_DRIVER = "gpu-tray.dradriver.dev"
PROFILE = "gb200-nvl72-tray"
TRAY_FLAGS = ("--driver-name", GPU_DRIVER, "--compute-domains", "true", "--cd-namespace", NAMESPACE)
USER_NS = "default"
DOMAIN = "node-imex"
TEMPLATE = "node-imex-channel"
TIMEOUT = 180.0

DOMAIN_DOC: dict[str, Any] = {
    "apiVersion": api.API_VERSION,
    "kind": "ComputeDomain",
    "metadata": {"name": DOMAIN, "namespace": USER_NS},
    "spec": {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": TEMPLATE}}},
}
WORKER_SCRIPT = "ls -l /dev/nvidia-caps-imex-channels; env | grep COMPUTE_DOMAIN; exec sleep 3600"
WORKER: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "imex-worker", "namespace": USER_NS},
    "spec": {
        "resourceClaims": [{"name": "imex-channel", "resourceClaimTemplateName": TEMPLATE}],
        "containers": [
            {
                "name": "worker",
                "image": "docker.io/library/busybox:1.36",
                "command": [
                    "sh",
                    "-c",
                    "ls -l /dev/nvidia-caps-imex-channels; env | grep COMPUTE_DOMAIN; exec sleep 3600",
                ],
                "resources": {"claims": [{"name": "imex-channel"}]},
            }
        ],
    },
}


@dataclass
class Tray:
    """The node as a GB200 tray with ComputeDomains on, and the controller."""

    node: RealNode
    driver: DriverRun
    controller: ControllerRun
    workloads: Workloads

    @property
    def cd_plugin_dir(self) -> Path:
        return self.node.kubelet.plugins_dir / api.DRIVER_NAME

    def kubectl(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([kubectl(), "--kubeconfig", str(self.node.control_plane.kubeconfig), *args],
                              capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip

    def daemon_pods(self, uid: str) -> list[dict[str, Any]]:
        return self.node.kube.list("pods", NAMESPACE, labelSelector=f"{api.DOMAIN_LABEL}={uid}")

    def node_label(self) -> str | None:
        labels = self.node.kube.get("nodes", self.node.name)["metadata"].get("labels") or {}
        value: str | None = labels.get(api.DOMAIN_LABEL)
        return value

    def describe(self) -> str:
        parts = []
        for pod in self.node.kube.list("pods", NAMESPACE, labelSelector=api.DOMAIN_LABEL):
            name = pod["metadata"]["name"]
            logs = self.kubectl("-n", NAMESPACE, "logs", name, "--tail=40")
            parts.append(f"daemon pod {name}: {json.dumps(pod.get('status'))}\nevents: "
                         f"{self.workloads.events(pod)}\nits log:\n{logs.stdout}{logs.stderr}")  # fmt: skip
        parts.append(f"worker: {self.workloads.describe(WORKER)}")
        controller = "\n".join(self.controller.log.read_text(errors="replace").splitlines()[-30:])
        driver = "\n".join(self.driver.log.splitlines()[-30:])
        parts.append(f"--- controller (last 30 lines) ---\n{controller}\n--- tray driver (last 30) ---\n{driver}")
        return "\n".join(parts)

    def wait(self, what: str, condition: Any, timeout: float = TIMEOUT) -> Any:
        try:
            return wait_for(what, condition, timeout, interval=0.5)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{self.describe()}") from None


@pytest.fixture(scope="module")
def tray(node: RealNode) -> Iterator[Tray]:
    node.containerd.import_archive(image_archive(), "localhost/dradriver")
    rendered = install_chart_parts(node.control_plane)
    kubeconfig = node.control_plane.kubeconfig
    driver = DriverRun(
        node.root / "tray-driver",
        node.name,
        kubeconfig,
        profile=PROFILE,
        mig_mode="none",
        version="1.37",
        extra=TRAY_FLAGS,
        registry_dir=node.kubelet.registry_dir,
        plugin_dir=node.kubelet.plugins_dir / GPU_DRIVER,
        cdi_dir=node.cdi_dir,
    )
    # Daemon pods reach the API server as this node's plugin pod does (docs/deployment.md, "On a bare kubelet").
    daemon_env = [
        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": str(node.control_plane.port)},
    ]
    pod_settings = ("--daemon-host-network", "true", "--daemon-env", json.dumps(daemon_env))
    controller = ControllerRun(kubeconfig, node.logs / "cd-controller.log", "node-controller", image=IMAGE,
                               extra=pod_settings)  # fmt: skip
    tray = Tray(node, driver, controller, Workloads(node))
    try:
        # Both drivers of the process registered: the GPU driver and compute-domain.dradriver.dev.
        tray.wait("the kubelet to register both drivers", lambda: node.registrations(driver) >= 2, 60)
        yield tray
    finally:
        tray.kubectl("delete", "--ignore-not-found", "--wait=false", "pod", WORKER["metadata"]["name"])
        tray.kubectl("delete", "--ignore-not-found", "--timeout=60s", "computedomain", DOMAIN)
        controller.stop()
        driver.stop()
        (node.logs / "tray-driver.log").write_text(driver.log)
        if tray.node_label() is not None:
            node.kube.patch("nodes", node.name, {"metadata": {"labels": {api.DOMAIN_LABEL: None}}})
        # Only the ComputeDomain objects go: the GPU driver's accounts and RBAC may serve other modules of this
        # control plane (the cluster tests' kustomize install has the same names).
        ours = [o for o in yaml.safe_load_all(rendered.read_text()) if o and "compute-domain" in o["metadata"]["name"]]
        rendered.write_text(yaml.safe_dump_all(ours))
        tray.kubectl("delete", "--ignore-not-found", "-f", str(rendered))


def test_the_kubelet_runs_the_domains_daemon_pod_and_the_worker_gets_its_channel(tray: Tray) -> None:
    kube = tray.node.kube
    tray.workloads.kubectl("apply", "-f", "-", input=yaml.safe_dump(DOMAIN_DOC))
    uid = kube.get("computedomains", DOMAIN, USER_NS)["metadata"]["uid"]
    tray.wait("the domain's claim template", lambda: kube.find("resourceclaimtemplates", TEMPLATE, USER_NS), 60)

    [worker_doc] = tray.workloads.apply([WORKER])
    # The first prepares fail until the daemon the channel pulled here is Ready; the kubelet retries.
    [worker] = tray.workloads.wait_running(worker_doc, timeout=TIMEOUT)

    # Its daemon pod: Ready once its probe (`dradriver cd-daemon check`, every 10 s) has passed.
    [daemon] = tray.wait("the daemon pod to be Ready", lambda: [p for p in tray.daemon_pods(uid) if running(p)], 60)
    assert daemon["spec"]["nodeName"] == tray.node.name and daemon["spec"]["hostNetwork"] is True
    [status] = daemon["status"]["containerStatuses"]
    assert status["image"] == IMAGE, status
    assert tray.node_label() == uid
    waited = tray.kubectl("wait", "--for=condition=Ready", f"computedomain/{DOMAIN}", "--timeout=60s")
    assert waited.returncode == 0, waited.stdout + waited.stderr + tray.describe()
    domain = kube.get("computedomains", DOMAIN, USER_NS)
    [entry] = domain["status"]["nodes"]
    assert (entry["name"], entry["index"], entry["status"]) == (tray.node.name, 0, "Ready"), domain["status"]
    assert entry["ipAddress"] == daemon["status"]["podIP"] and entry["cliqueID"], entry

    # The worker's container holds channel 0 with the major number of /proc/devices, and its domain.
    log = tray.workloads.kubectl("-n", USER_NS, "logs", worker["metadata"]["name"])
    assert re.search(rf"^c\S+\s.*\b{IMEX_CHANNELS_MAJOR},\s+0\s.*\bchannel0$", log, re.MULTILINE), log
    assert f"COMPUTE_DOMAIN_UUID={uid}" in log, log
    # The IMEX daemon (the simulated driver's nvidia-imex, mounted by the daemon claim) knows itself as node 0.
    table = tray.kubectl("-n", NAMESPACE, "exec", daemon["metadata"]["name"], "--", "nvidia-imex-ctl", "-c",
                         "/imexd/imexd.cfg", "-N")  # fmt: skip
    assert table.returncode == 0, table.stdout + table.stderr
    assert f"0 compute-domain-daemon-0000 {entry['ipAddress']} I" in table.stdout, table.stdout
    # What docs/computedomains.md shows (pytest -s prints it).
    print(f"$ kubectl wait --for=condition=Ready computedomain/{DOMAIN}\n{waited.stdout}$ kubectl logs "
          f"{worker['metadata']['name']}\n{log}$ kubectl -n {NAMESPACE} exec {daemon['metadata']['name']} -- "
          f"nvidia-imex-ctl -c /imexd/imexd.cfg -N\n{table.stdout}")  # fmt: skip
    worker_claims = claim_names(worker)
    daemon_claims = claim_names(daemon)

    _crash_the_daemon_and_see_it_rejoin(tray, uid, daemon, worker)

    # The worker goes: its channel is unprepared, the node label removed, the daemon pod goes with it.
    tray.workloads.delete([worker_doc])
    tray.wait("the node label to be removed", lambda: tray.node_label() is None, 60)
    tray.wait("the daemon pod to be gone", lambda: not tray.daemon_pods(uid), 90)
    # Then the domain: nothing of it is left.
    deleted = tray.kubectl("delete", "computedomain", DOMAIN, "--timeout=60s")
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr + tray.describe()
    assert kube.find("computedomains", DOMAIN, USER_NS) is None
    labelled = f"{api.DOMAIN_LABEL}={uid}"
    tray.wait("the domain's claim templates to be gone",
              lambda: not kube.list("resourceclaimtemplates", labelSelector=labelled), 30)  # fmt: skip
    assert not kube.list("daemonsets", NAMESPACE, labelSelector=labelled)
    assert not [c for c in kube.list("computedomaincliques", NAMESPACE) if c["metadata"]["name"].startswith(uid)]
    tray.wait("the claims of the worker and the daemon to be gone", lambda: not (
        [n for n in worker_claims if kube.find("resourceclaims", n, USER_NS)]
        + [n for n in daemon_claims if kube.find("resourceclaims", n, NAMESPACE)]), 60)  # fmt: skip
    assert not list(tray.node.cdi_dir.glob(f"{api.CDI_VENDOR}-*.json")), "a CDI spec of the domain's claims is left"
    checkpoint = json.loads((tray.cd_plugin_dir / "checkpoint.json").read_text())
    assert checkpoint["claims"] == {}, checkpoint
    assert not (tray.cd_plugin_dir / "domains" / uid).exists()


def _crash_the_daemon_and_see_it_rejoin(tray: Tray, uid: str, daemon: dict[str, Any], worker: dict[str, Any]) -> None:
    """The daemon crashes (its container's init SIGKILLed, as an OOM kill would): the kubelet restarts the
    container in the same pod, the daemon rejoins with the index it had, the domain is Ready again, and the
    worker never noticed."""
    kube = tray.node.kube
    [status] = daemon["status"]["containerStatuses"]
    container_id = status["containerID"].removeprefix("containerd://")
    os.kill(tray.node.container_pids()[container_id], signal.SIGKILL)

    def restarted_and_ready() -> bool:
        pods = [p for p in tray.daemon_pods(uid) if p["metadata"]["uid"] == daemon["metadata"]["uid"]]
        return bool(pods) and running(pods[0]) and pods[0]["status"]["containerStatuses"][0]["restartCount"] >= 1

    tray.wait("the daemon container to be restarted and Ready", restarted_and_ready, 120)
    waited = tray.kubectl("wait", "--for=condition=Ready", f"computedomain/{DOMAIN}", "--timeout=60s")
    assert waited.returncode == 0, waited.stdout + waited.stderr + tray.describe()
    [again] = kube.get("computedomains", DOMAIN, USER_NS)["status"]["nodes"]
    assert (again["name"], again["index"], again["status"]) == (tray.node.name, 0, "Ready")
    still = kube.get("pods", worker["metadata"]["name"], USER_NS)
    assert still["metadata"]["uid"] == worker["metadata"]["uid"] and running(still)
    assert still["status"]["containerStatuses"][0]["restartCount"] == 0
