"""List-typed attributes (KEP-6072, `dradriver run --list-attributes true`): the real API server stores a node's
slices with resource.kubernetes.io/numaNode as a list, and the real scheduler allocates a claim whose selector
reads it as one, as claims written for NVIDIA's driver with DRAListTypeAttributes do."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.cluster_node import SimNode
from support.cluster_pods import NAMESPACE, GatedPod, allocated_devices
from support.control_plane import ControlPlane
from support.kube_rest import Kube

NODE = "gpu-lists"


@pytest.fixture(scope="module")
def list_node(control_plane: ControlPlane, kube: Kube, device_classes: None) -> Iterator[SimNode]:
    node = SimNode.start(
        kube,
        control_plane.kubeconfig,
        control_plane.root / NODE,
        NODE,
        profile="mixed",
        mig_mode="none",
        version="1.37",
        extra=("--list-attributes", "true"),
    )
    try:
        yield node
    finally:
        (control_plane.logs / f"dradriver-{NODE}.log").write_text(node.driver.log)
        node.stop()
        kube.delete_all("resourceslices", fieldSelector=f"spec.nodeName={NODE}")
        kube.delete("nodes", NODE)


def test_the_scheduler_selects_on_a_list_numa_node(list_node: SimNode, kube: Kube) -> None:
    kube.wait(
        "slices with list numaNode",
        lambda: any(
            d["attributes"].get("resource.kubernetes.io/numaNode", {}).get("ints") == [1]
            for s in kube.list("resourceslices", fieldSelector=f"spec.nodeName={NODE}")
            for d in s["spec"].get("devices", [])
        ),
    )
    selector = 'device.attributes["resource.kubernetes.io"].numaNode.exists(n, n == 1)'
    template = {
        "metadata": {"name": "numa-list", "namespace": NAMESPACE},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": "gpu.dradriver.dev",
                                "selectors": [{"cel": {"expression": selector}}],
                            },
                        }
                    ]
                }
            }
        },
    }
    kube.create("resourceclaimtemplates", template, NAMESPACE)
    pod = GatedPod(kube, "numa-list", "numa-list", node=NODE).create()
    try:
        assert pod.release() == "scheduled", pod.get().get("status")
        [(_, _, device)] = allocated_devices(pod.claim())
        slices = kube.list("resourceslices", fieldSelector=f"spec.nodeName={NODE}")
        [found] = [d for s in slices for d in s["spec"].get("devices", []) if d["name"] == device]
        assert found["attributes"]["resource.kubernetes.io/numaNode"] == {"ints": [1]}  # an L4 of "mixed"
    finally:
        pod.delete()
        kube.delete("resourceclaimtemplates", "numa-list", NAMESPACE)
