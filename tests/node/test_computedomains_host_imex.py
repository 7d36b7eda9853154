"""Host-managed IMEX on the real node (issue #38 item 3, docs/computedomains.md "Host-managed IMEX"): a simulated
GB200 tray whose driver runs `--compute-domains true --imex-mode hostManaged`, beside the host's own IMEX service
(the IMEX stand-in with its control socket, as an admin's nvidia-imex.service would be). A worker of a ComputeDomain
waits while the host's daemon is down (the plugin's prepare says it is not READY and the kubelet retries), starts
once it answers READY with IMEX channel 0, and no daemon per domain runs: the controller, `--imex-mode hostManaged`
too, creates no DaemonSet and reports the domain Ready once admitted (before the host's daemon is up: Ready promises
the claim template, and prepare asks the host), and the Node gets no domain label. Deleting the worker and the
domain leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.cd_cluster import NAMESPACE, ControllerRun, install_chart_parts, install_nvidia_chart_parts
from support.cluster_node import DriverRun
from support.node_pods import Workloads
from support.real_node import RealNode, wait_for

from dradriver.computedomain import api
from dradriver.sim.fabric import IMEX_CHANNELS_MAJOR
from tests.computedomain.test_host_imex import HostService
from tests.node.test_computedomains import DOMAIN_DOC, PROFILE, TEMPLATE, USER_NS, WORKER

GPU_DRIVER = "gpu-hostimex.dradriver.dev"
TIMEOUT = 120.0


class HostTray:
    def __init__(
        self, node: RealNode, driver: DriverRun, host: HostService, names: api.ComputeDomainNames = api.OURS
    ) -> None:
        self.node, self.driver, self.host, self.names = node, driver, host, names
        self.workloads = Workloads(node)

    def domain(self, name: str, namespace: str) -> dict[str, Any]:
        """The ComputeDomain ``namespace/name`` of the tray's group (ours, or NVIDIA's under --compat nvidia)."""
        found: dict[str, Any] = self.node.kube.request(
            "GET", f"/apis/{self.names.api_version}/namespaces/{namespace}/computedomains/{name}"
        )
        return found

    def domain_status(self) -> dict[str, Any]:
        status: dict[str, Any] = self.domain(DOMAIN_DOC["metadata"]["name"], USER_NS).get("status") or {}
        return status

    def node_label(self) -> str | None:
        labels = self.node.kube.get("nodes", self.node.name)["metadata"].get("labels") or {}
        value: str | None = labels.get(self.names.domain_label)
        return value


# Under --compat nvidia: the chart's parts rendered with compat=nvidia, in a release and namespace of their own.
NVIDIA_RELEASE = "dradriver-nv"


@contextlib.contextmanager
def host_managed_tray(node: RealNode, root: Path, *, compat: str = "none") -> Iterator[HostTray]:
    """The tray's driver and the controller, both ``--imex-mode hostManaged`` (and ``--compat compat``), beside the
    host's IMEX service (not started); the chart's parts they need installed, and removed again at the end."""
    names = api.names_of(compat)
    plane = node.control_plane
    if compat == "nvidia":
        namespace, gpu_driver = NVIDIA_RELEASE, "gpu.nvidia.com"
        rendered = install_nvidia_chart_parts(plane, NVIDIA_RELEASE, namespace)
        flags: tuple[str, ...] = ("--compat", "nvidia")
    else:
        namespace, gpu_driver = NAMESPACE, GPU_DRIVER
        rendered = install_chart_parts(plane)
        flags = ("--driver-name", GPU_DRIVER, "--compat", "none")
    host = HostService(root / "host-imex")
    driver = DriverRun(
        node.root / f"hostimex-driver-{compat}",
        node.name,
        plane.kubeconfig,
        profile=PROFILE,
        mig_mode="none",
        version="1.37",
        extra=(*flags, "--compute-domains", "true", "--cd-namespace", namespace,
               "--imex-mode", "hostManaged", "--imex-host-socket-path", str(host.socket)),
        registry_dir=node.kubelet.registry_dir,
        plugin_dir=node.kubelet.plugins_dir / gpu_driver,
        cdi_dir=node.cdi_dir,
    )  # fmt: skip
    controller = ControllerRun(
        plane.kubeconfig,
        node.logs / f"cd-controller-hostimex-{compat}.log",
        f"hostimex-{compat}",
        extra=("--imex-mode", "hostManaged", "--namespace", namespace, "--compat", compat),
    )
    tray = HostTray(node, driver, host, names)
    try:
        wait_for("the kubelet to register both drivers", lambda: node.registrations(driver) >= 2, 60)
        yield tray
    finally:
        tray.workloads.kubectl("delete", "--ignore-not-found", "--wait=false", "pod", WORKER["metadata"]["name"])
        tray.workloads.kubectl(  # the kind in full: both groups' CRDs may be served
            "delete",
            "--ignore-not-found",
            "--timeout=60s",
            f"computedomains.{names.group}",
            DOMAIN_DOC["metadata"]["name"],
        )
        controller.stop()
        driver.stop()
        host.stop()
        (node.logs / f"hostimex-driver-{compat}.log").write_text(driver.log)
        # Ours: the CRDs stay for the other modules. NVIDIA's: its CRDs go too (and the domains left of them).
        ours = [o for o in yaml.safe_load_all(rendered.read_text())
                if o and (compat == "nvidia" or "compute-domain" in o["metadata"]["name"])]  # fmt: skip
        rendered.write_text(yaml.safe_dump_all(ours))
        tray.workloads.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", str(rendered))


@pytest.fixture(scope="module")
def host_tray(node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostTray]:
    with host_managed_tray(node, tmp_path_factory.mktemp("host-imex")) as tray:
        yield tray


def test_the_worker_gets_channel_0_from_the_hosts_imex_daemon_and_no_daemon_runs(host_tray: HostTray) -> None:
    kube, workloads = host_tray.node.kube, host_tray.workloads
    workloads.kubectl("apply", "-f", "-", input=yaml.safe_dump(DOMAIN_DOC))
    uid = kube.get("computedomains", DOMAIN_DOC["metadata"]["name"], USER_NS)["metadata"]["uid"]
    wait_for("the domain's claim template", lambda: kube.find("resourceclaimtemplates", TEMPLATE, USER_NS), 60)
    # Ready once admitted, while the host's daemon is still down; no DaemonSet, no daemon claim template.
    wait_for("the domain Ready", lambda: host_tray.domain_status().get("status") == "Ready", 60)
    [ready] = [c for c in host_tray.domain_status()["conditions"] if c["type"] == "Ready"]
    assert (ready["status"], ready["reason"]) == ("True", "HostManagedIMEX"), ready
    assert host_tray.domain_status()["nodes"] == []
    labelled = f"{api.DOMAIN_LABEL}={uid}"
    assert not kube.list("daemonsets", NAMESPACE, labelSelector=labelled)
    assert not kube.list("resourceclaimtemplates", NAMESPACE, labelSelector=labelled)
    [worker_doc] = workloads.apply([WORKER])
    # The host's daemon is down: the plugin says so and the kubelet keeps retrying.
    wait_for("a prepare refused for the host's daemon",
             lambda: "host's IMEX daemon on node" in host_tray.driver.log, TIMEOUT)  # fmt: skip
    host_tray.host.start()
    [worker] = workloads.wait_running(worker_doc, timeout=TIMEOUT)
    log = workloads.kubectl("-n", USER_NS, "logs", worker["metadata"]["name"])
    assert re.search(rf"^c\S+\s.*\b{IMEX_CHANNELS_MAJOR},\s+0\s.*\bchannel0$", log, re.MULTILINE), log
    assert f"COMPUTE_DOMAIN_UUID={uid}" in log, log
    # No daemon per domain: the Node is not labelled, so the domain's DaemonSet runs no pod.
    assert host_tray.node_label() is None
    assert not kube.list("pods", NAMESPACE, labelSelector=labelled)
    assert not kube.list("daemonsets", NAMESPACE, labelSelector=labelled)

    workloads.delete([worker_doc])
    deleted = workloads.kubectl("delete", "computedomain", DOMAIN_DOC["metadata"]["name"], "--timeout=60s")
    assert kube.find("computedomains", DOMAIN_DOC["metadata"]["name"], USER_NS) is None, deleted
    plugin_dir: Path = host_tray.node.kubelet.plugins_dir / api.DRIVER_NAME
    wait_for("the channel to be unprepared",
             lambda: json.loads((plugin_dir / "checkpoint.json").read_text())["claims"] == {}, 60)  # fmt: skip
    assert not list(host_tray.node.cdi_dir.glob(f"{api.CDI_VENDOR}-*.json"))
