"""A device-plugin style pod (`nvidia.com/gpu: 1`, no claim written) through the real scheduler: the DeviceClass
gpu.dradriver.dev maps the extended resource (KEP-5004), so the scheduler writes a claim for one whole GPU and
allocates it from our slices. Also the recovery docs/troubleshooting.md gives for kube-scheduler forgetting that
mapping when a second class with the same name is deleted (kubernetes/kubernetes#141103)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from support.cluster_node import SimNode
from support.cluster_pods import NAMESPACE, TIMEOUT, allocated_devices
from support.kube_rest import Kube

NODE = "gpu-mixed"
CLASS = "gpu.dradriver.dev"


def extended_resource_pod(kube: Kube) -> dict[str, Any]:
    name = f"ext-{uuid.uuid4().hex[:8]}"
    return kube.create(
        "pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": NODE},
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    }
                ],
            },
        },
        NAMESPACE,
    )


def scheduled_claim(kube: Kube, name: str) -> dict[str, Any]:
    """The claim the scheduler wrote for the pod's extended resource, once the pod is bound. An Unschedulable
    answer is not final (the scheduler retries the pod when a DeviceClass changes); it is named if time runs out."""
    said: list[str] = []

    def bound() -> str | None:
        pod = kube.get("pods", name, NAMESPACE)
        said[:] = [
            c.get("message", "") for c in pod.get("status", {}).get("conditions") or [] if c["type"] == "PodScheduled"
        ]
        claim = (pod.get("status", {}).get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
        return claim if pod["spec"].get("nodeName") and claim else None

    try:
        claim_name = kube.wait(f"pod {name} to be bound", bound, TIMEOUT)
    except Exception as exc:
        raise AssertionError(f"{exc}; the scheduler said: {said}") from None
    return kube.get("resourceclaims", claim_name, NAMESPACE)


def end(kube: Kube, name: str) -> None:
    """End the pod as a kubelet would, then delete it (no kubelet runs on the simulated nodes)."""
    kube.patch("pods", name, {"status": {"phase": "Succeeded"}}, NAMESPACE, sub="status")
    kube.delete("pods", name, NAMESPACE, gracePeriodSeconds="0")
    kube.wait(f"pod {name} to go", lambda: kube.find("pods", name, NAMESPACE) is None, TIMEOUT)


@pytest.fixture
def pods(nodes: dict[str, SimNode], kube: Kube) -> Iterator[list[str]]:
    created: list[str] = []
    yield created
    for name in created:
        end(kube, name)


def test_an_extended_resource_pod_gets_one_whole_gpu_of_our_class(pods: list[str], kube: Kube) -> None:
    pods.append(extended_resource_pod(kube)["metadata"]["name"])
    claim = scheduled_claim(kube, pods[0])
    [(driver, pool, device)] = allocated_devices(claim)
    assert (driver, pool) == (CLASS, NODE)
    assert "-mig-" not in device  # whole GPUs only: the class selects type "gpu"
    assert claim["metadata"]["annotations"]["resource.kubernetes.io/extended-resource-claim"] == "true"


def test_touching_the_class_restores_the_mapping_after_a_duplicate_is_deleted(pods: list[str], kube: Kube) -> None:
    # A second class with the same extended resource name, created later (so the scheduler prefers it), then deleted.
    shadow = f"shadow-{uuid.uuid4().hex[:8]}.dradriver.dev"
    kube.create(
        "deviceclasses",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": shadow},
            "spec": {
                "extendedResourceName": "nvidia.com/gpu",
                "selectors": [{"cel": {"expression": 'device.driver == "nothing.example.com"'}}],
            },
        },
    )
    kube.delete("deviceclasses", shadow)
    # The recovery docs/troubleshooting.md gives: any change to the remaining class makes the scheduler map it again.
    kube.patch("deviceclasses", CLASS, {"metadata": {"annotations": {"dradriver.dev/touched": str(time.time_ns())}}})
    pods.append(extended_resource_pod(kube)["metadata"]["name"])
    [(driver, pool, _)] = allocated_devices(scheduled_claim(kube, pods[0]))
    assert (driver, pool) == (CLASS, NODE)
