"""Device health through the real kubelet (KEP-4680, ``v1.DRAResourceHealth`` on a 1.37 kubelet): an XID on a GPU
in use makes the pod's status report the device unhealthy (allocatedResourcesStatus), and the device's slice
taint keeps new pods away from it."""

from __future__ import annotations

from typing import Any

from support.kube_rest import Kube
from support.node_pods import Workloads, claims_of
from support.real_node import DRIVER, RealNode, wait_for

from node.test_pods import GPU_CLASS, NAMESPACE, pod, template, unique

XID_TAINT = "gpu.dradriver.dev/xid"


def allocated_device(kube: Kube, running: dict[str, Any]) -> str:
    [claim] = claims_of(kube, running)
    [result] = claim["status"]["allocation"]["devices"]["results"]
    return str(result["device"])


def slice_device(kube: Kube, node: str, device: str) -> dict[str, Any]:
    for item in kube.list("resourceslices", fieldSelector=f"spec.nodeName={node},spec.driver={DRIVER}"):
        for entry in item["spec"].get("devices") or []:
            if entry["name"] == device:
                return dict(entry)
    raise AssertionError(f"device {device} is in no ResourceSlice of node {node}")


def resource_health(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """Every entry of the pod's containers' allocatedResourcesStatus[].resources[]."""
    found = []
    for status in pod.get("status", {}).get("containerStatuses") or []:
        for resource in status.get("allocatedResourcesStatus") or []:
            found += resource.get("resources") or []
    return found


def test_an_xid_on_a_gpu_in_use_shows_in_pod_status_and_the_taint_keeps_new_pods_away(
    node: RealNode, workloads: Workloads, kube: Kube
) -> None:
    name = unique("health")
    # An A100 without MIG partitions: the XID hurts only this GPU.
    selector = 'device.attributes["gpu.dradriver.dev"].productName == "NVIDIA A100-SXM4-40GB"'
    docs = [template(name, GPU_CLASS, selector), pod(name, {"gpu": {"resourceClaimTemplateName": name}}, "true")]
    workloads.apply(docs)
    device, pci = "", ""
    later: list[dict[str, Any]] = []
    try:
        [running] = workloads.wait_running(docs[1])
        device = allocated_device(kube, running)
        attributes = slice_device(kube, node.name, device)["attributes"]
        uuid, pci = attributes["uuid"]["string"], attributes["resource.kubernetes.io/pciBusID"]["string"]
        healthy = wait_for(
            "the kubelet to report the device's health in the pod status",
            lambda: resource_health(kube.get("pods", name, NAMESPACE)),
            60,
        )
        assert all(r["health"] == "Healthy" for r in healthy), healthy
        node.sim("xid", pci, "79")
        unhealthy = wait_for(
            "the pod status to report the device unhealthy",
            lambda: [r for r in resource_health(kube.get("pods", name, NAMESPACE)) if r["health"] == "Unhealthy"],
            60,
        )
        assert unhealthy, unhealthy
        wait_for(
            "the device's slice taint",
            lambda: any(t["key"] == XID_TAINT for t in slice_device(kube, node.name, device).get("taints") or []),
            60,
        )
        # A new claim that can only have this GPU stays unscheduled.
        only = unique("only-that-gpu")
        later = [
            template(only, GPU_CLASS, f'device.attributes["gpu.dradriver.dev"].uuid == "{uuid}"'),
            pod(only, {"gpu": {"resourceClaimTemplateName": only}}, "true"),
        ]
        workloads.apply(later)
        unschedulable = wait_for(
            "the scheduler to refuse the pod",
            lambda: [
                c
                for c in kube.get("pods", only, NAMESPACE).get("status", {}).get("conditions") or []
                if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
            ],
            60,
        )
        assert unschedulable and not kube.get("pods", only, NAMESPACE)["spec"].get("nodeName")
    finally:
        workloads.delete([*reversed(later), *reversed(docs)])
        if pci:
            node.sim("reset", pci)  # healthy again for the tests that follow
