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

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.cd_cluster import NAMESPACE, ControllerRun, install_chart_parts
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
    def __init__(self, node: RealNode, driver: DriverRun, host: HostService) -> None:
        self.node, self.driver, self.host = node, driver, host
        self.workloads = Workloads(node)

    def domain_status(self) -> dict[str, Any]:
        domain = self.node.kube.get("computedomains", DOMAIN_DOC["metadata"]["name"], USER_NS)
        status: dict[str, Any] = domain.get("status") or {}
        return status

    def node_label(self) -> str | None:
        labels = self.node.kube.get("nodes", self.node.name)["metadata"].get("labels") or {}
        value: str | None = labels.get(api.DOMAIN_LABEL)
        return value


@pytest.fixture(scope="module")
def host_tray(node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostTray]:
    rendered = install_chart_parts(node.control_plane)
    host = HostService(tmp_path_factory.mktemp("host-imex"))
    driver = DriverRun(
        node.root / "hostimex-driver",
        node.name,
        node.control_plane.kubeconfig,
        profile=PROFILE,
        mig_mode="none",
        version="1.37",
        extra=("--driver-name", GPU_DRIVER, "--compute-domains", "true", "--cd-namespace", NAMESPACE,
               "--imex-mode", "hostManaged", "--imex-host-socket-path", str(host.socket)),
        registry_dir=node.kubelet.registry_dir,
        plugin_dir=node.kubelet.plugins_dir / GPU_DRIVER,
        cdi_dir=node.cdi_dir,
    )  # fmt: skip
    controller = ControllerRun(
        node.control_plane.kubeconfig,
        node.logs / "cd-controller-hostimex.log",
        "hostimex",
        extra=("--imex-mode", "hostManaged"),
    )
    tray = HostTray(node, driver, host)
    try:
        wait_for("the kubelet to register both drivers", lambda: node.registrations(driver) >= 2, 60)
        yield tray
    finally:
        tray.workloads.kubectl("delete", "--ignore-not-found", "--wait=false", "pod", WORKER["metadata"]["name"])
        tray.workloads.kubectl(
            "delete", "--ignore-not-found", "--timeout=60s", "computedomain", DOMAIN_DOC["metadata"]["name"]
        )
        controller.stop()
        driver.stop()
        host.stop()
        (node.logs / "hostimex-driver.log").write_text(driver.log)
        ours = [o for o in yaml.safe_load_all(rendered.read_text()) if o and "compute-domain" in o["metadata"]["name"]]
        rendered.write_text(yaml.safe_dump_all(ours))
        tray.workloads.kubectl("delete", "--ignore-not-found", "-f", str(rendered))


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
