"""NVIDIA's IMEX channel-injection examples (tests/fixtures/nvidia-imex: demo/specs/imex/channel-injection.yaml and
channel-injection-all.yaml) on the real kubelet and containerd with host-managed IMEX, under --compat nvidia: the
simulated GB200 tray and the controller of tests/node/test_computedomains_host_imex.py (`--imex-mode hostManaged`,
the host's IMEX service up), both run with `--compat nvidia`, and the chart's ComputeDomain parts rendered with
compat=nvidia (NVIDIA's CRDs and DeviceClasses). The ComputeDomain applies as written (resource.nvidia.com/v1beta1);
only the pod's image and shell are replaced (busybox's `sh` runs NVIDIA's script as written; the node has no
registry). The pod lists channel 0 (`All`: every channel) from the host's daemon, served by compute-domain.nvidia.com;
no daemon per domain runs, and deleting the manifest unprepares the channel."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.real_node import RealNode, wait_for

from dradriver.computedomain import api
from tests.node.test_computedomains_host_imex import NVIDIA_RELEASE, TIMEOUT, HostTray, host_managed_tray

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests/fixtures/nvidia-imex"


NAMES = api.NVIDIA


@pytest.fixture(scope="module")
def nvidia_tray(node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostTray]:
    with host_managed_tray(node, tmp_path_factory.mktemp("host-imex-nvidia"), compat="nvidia") as tray:
        yield tray


def as_we_run_it(path: Path) -> list[dict[str, Any]]:
    """NVIDIA's manifest with busybox for its pod's image and shell; its ComputeDomain as written."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for doc in docs:
        if doc["kind"] == "ComputeDomain":
            assert doc["apiVersion"] == NAMES.api_version
        elif doc["kind"] == "Pod":
            [container] = doc["spec"]["containers"]
            assert container["command"] == ["bash", "-c"]
            container["image"], container["command"] = "docker.io/library/busybox:1.36", ["sh", "-c"]
    return docs


def channels_unprepared(tray: HostTray) -> bool:
    checkpoint = tray.node.kubelet.plugins_dir / NAMES.driver_name / "checkpoint.json"
    return bool(json.loads(checkpoint.read_text())["claims"] == {})


@pytest.mark.parametrize(
    ("name", "channels"), [("channel-injection", 1), ("channel-injection-all", api.MAX_IMEX_CHANNELS)]
)
def test_nvidias_channel_injection_gets_its_channels_from_the_hosts_imex_daemon(
    nvidia_tray: HostTray, name: str, channels: int
) -> None:
    tray = nvidia_tray
    if tray.host.proc is None:
        tray.host.start()
    docs = as_we_run_it(FIXTURES / f"{name}.yaml")
    [domain] = [d for d in docs if d["kind"] == "ComputeDomain"]
    applied = tray.workloads.apply(docs)
    [pod_doc] = [d for d in applied if d["kind"] == "Pod"]
    try:
        [pod] = tray.workloads.wait_running(pod_doc, timeout=TIMEOUT)
        log = tray.workloads.kubectl("logs", pod["metadata"]["name"])
        listed = re.findall(r"\bchannel(\d+)$", log, re.MULTILINE)
        assert len(listed) == channels and "0" in listed, log
        # Served under NVIDIA's names: its finalizer on the domain, its driver's channel in the pod's claim.
        served = tray.domain(domain["metadata"]["name"], "default")
        assert served["metadata"]["finalizers"] == [NAMES.finalizer]
        [claim] = tray.node.kube.list("resourceclaims", "default")
        assert {r["driver"] for r in claim["status"]["allocation"]["devices"]["results"]} == {NAMES.driver_name}
        # No daemon per domain: no DaemonSet, and the Node carries no domain label.
        labelled = f"{NAMES.domain_label}={served['metadata']['uid']}"
        assert not tray.node.kube.list("daemonsets", NVIDIA_RELEASE, labelSelector=labelled)
        assert tray.node_label() is None
    finally:
        tray.workloads.delete(applied)
    wait_for("the channel claim to be unprepared", lambda: channels_unprepared(tray), 60)
    assert not list(tray.node.cdi_dir.glob(f"{NAMES.cdi_vendor}-*.json"))
