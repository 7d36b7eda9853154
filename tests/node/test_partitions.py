"""NVSwitch partitions on the real kubelet and containerd (issue #38 item 2, docs/partitions.md): NVIDIA's own
Fabric Manager partitioning example (two `vfio.gpu.nvidia.com` devices aligned on `gpu.nvidia.com/partition2`) on a
simulated HGX H100 node whose driver runs `--compat nvidia --passthrough true --fabric-manager-partitions true`.
The scheduler gives the pod the two GPUs of one 2-GPU partition, prepare activates exactly that partition in the
simulated Fabric Manager, and once the pod is deleted the partition is inactive again.

The node is this module's own (Node fm-compat); the Fabric Manager stand-in keeps its state beside the node's
simulated state file, which the test reads as an admin would ask FM."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cluster_fixtures import running_node
from support.cluster_pods import kubectl, kubectl_apply
from support.control_plane import ControlPlane
from support.node_pods import Workloads, claims_of, documents, on_busybox, unprepared
from support.real_node import RealNode, wait_for

from dradriver.driver.prepare.presets import NVIDIA

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "tests/fixtures/nvidia-fabric-manager/fm-partition.yaml"
CLASSES = REPO / "src/dradriver/cli/data/deviceclasses/passthrough-nvidia.yaml"
NODE = "fm-compat"
# hgx-h100-80gb's 2-GPU partitions as Fabric Manager numbers them (docs/partitions.md), by passthrough device.
PAIRS = {
    3: ("gpu-0000-1b-00-0-vfio", "gpu-0000-43-00-0-vfio"),
    4: ("gpu-0000-52-00-0-vfio", "gpu-0000-61-00-0-vfio"),
    5: ("gpu-0000-9d-00-0-vfio", "gpu-0000-c3-00-0-vfio"),
    6: ("gpu-0000-d1-00-0-vfio", "gpu-0000-df-00-0-vfio"),
}


@pytest.fixture(scope="module")
def fm_node(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    kubectl_apply(kubectl(), control_plane.kubeconfig, CLASSES)
    host = tmp_path_factory.mktemp("fm-compat") / "host"
    args = ("--compat", "nvidia", "--passthrough", "true", "--passthrough-host-root", str(host))
    args += ("--fabric-manager-partitions", "true")
    with running_node(
        control_plane,
        name=NODE,
        profile="hgx-h100-80gb",
        mig_mode="none",
        driver_name=NVIDIA.driver_name,
        driver_args=args,
    ) as node:
        yield node


def active(node: RealNode) -> list[int]:
    path = node.root / "driver" / "sim.json.fabric-manager.json"
    return json.loads(path.read_text())["active"] if path.exists() else []


def test_nvidias_partition_example_gets_one_partition_activated_while_it_runs(fm_node: RealNode) -> None:
    docs = documents(MANIFEST)
    on_busybox(docs, "sleep 3600")
    workloads = Workloads(fm_node)
    applied = workloads.apply(docs)
    [pod_doc] = [d for d in applied if d["kind"] == "Pod"]
    try:
        [pod] = workloads.wait_running(pod_doc)
        [claim] = claims_of(fm_node.kube, pod)
        results = claim["status"]["allocation"]["devices"]["results"]
        devices = tuple(sorted(r["device"] for r in results))
        assert all(r["driver"] == NVIDIA.driver_name for r in results)
        [partition] = [p for p, pair in PAIRS.items() if pair == devices]
        assert active(fm_node) == [partition]
    finally:
        workloads.delete(applied)
    wait_for("the claim to be unprepared", lambda: unprepared(fm_node, claim["metadata"]["uid"]), 60)
    assert active(fm_node) == []
