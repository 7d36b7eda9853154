"""Device health through the real kubelet (KEP-4680, ``v1.DRAResourceHealth`` on a 1.37 kubelet): an XID on a GPU
in use makes the pod's status report the device unhealthy (allocatedResourcesStatus), and the device's slice
taint keeps new pods away from it; the kubelet opens the newest health version a plugin advertises."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from support.kube_rest import Kube
from support.kubelet_plugin_fakes import FakeClaimSource, FakeHandler
from support.node_pods import Workloads, claims_of
from support.real_node import DRIVER, RealNode, wait_for

from dradriver.plugin.handler import HealthBoard
from dradriver.plugin.kubeletplugin.plugin import KubeletPlugin, KubeletPluginOptions
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
        node.sim("xid", pci, "62")  # fatal, and the GPU keeps answering (79 takes it off the bus)
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
    if device:
        # A reset GPU is healthy at the next probe: the tests that follow must not meet the taint.
        wait_for(
            "the slice taint to go after the reset",
            lambda: not any(t["key"] == XID_TAINT for t in slice_device(kube, node.name, device).get("taints") or []),
            60,
        )


@pytest.mark.parametrize(
    "versions", [("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"), ("v1alpha1.DRAResourceHealth",)]
)
def test_the_real_kubelet_opens_the_newest_health_version_a_plugin_advertises(
    node: RealNode, versions: tuple[str, ...], caplog: pytest.LogCaptureFixture
) -> None:
    # A second driver on the generic plugin layer, in this process, advertising ``versions`` (only v1alpha1:
    # a driver written before 1.37): the 1.37 kubelet opens v1 when offered, else falls back to v1alpha1.
    options = KubeletPluginOptions(
        driver_name=f"health{len(versions)}.test.dradriver.dev",
        node_name=node.name,
        registry_dir=node.kubelet.registry_dir,
        plugin_dir=node.kubelet.plugins_dir / f"health{len(versions)}",
        health_versions=versions,
    )
    plugin = KubeletPlugin(options, handler=FakeHandler(), claim_source=FakeClaimSource(), health_source=HealthBoard())
    caplog.set_level(logging.INFO, logger="dradriver.plugin.kubeletplugin.health")
    plugin.start()
    try:
        opened = wait_for(
            "the kubelet to open the health stream",
            lambda: [r.getMessage() for r in caplog.records if "opened the health stream" in r.getMessage()],
            60,
        )
        wanted = versions[0].split(".")[0]
        assert opened[0].endswith(f"version={wanted}"), opened
    finally:
        plugin.stop()
