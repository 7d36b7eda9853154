"""A GPU and its passthrough device (`dradriver run --passthrough true`) through the real scheduler and
`dradriver explain`: they consume one counter set, so a claim on either is allocated alone, and a second claim on
the other waits unschedulable instead of reaching prepare, in every MIG mode (the simulated "mixed" node: an A100
with dynamic MIG's counters, L4s with a set made for them)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.cluster_node import SimNode, remove_nodes
from support.cluster_pods import NAMESPACE, GatedPod, allocated_devices, claim_template
from support.control_plane import ControlPlane
from support.kube_rest import Kube

from dradriver.cli.explain import EXIT_DOES_NOT_FIT, EXIT_FITS

REPO = Path(__file__).resolve().parents[2]
VFIO_CLASSES = REPO / "src/dradriver/cli/data/deviceclasses/passthrough.yaml"
MODES = ("none", "static", "dynamic")
A100, L4 = "0000:0f:00.0", "0000:87:00.0"  # a MIG-capable GPU (counters of dynamic MIG) and one without MIG


@pytest.fixture(scope="module")
def vfio_nodes(control_plane: ControlPlane, kube: Kube, device_classes: None) -> Iterator[dict[str, SimNode]]:
    created: list[str] = []  # the passthrough class, as the chart installs it with passthrough.enabled
    for device_class in yaml.safe_load_all(VFIO_CLASSES.read_text()):
        if device_class and kube.find("deviceclasses", device_class["metadata"]["name"]) is None:
            created.append(kube.create("deviceclasses", device_class)["metadata"]["name"])
    started: dict[str, SimNode] = {}
    try:
        for mode in MODES:
            name = f"vfio-{mode}"
            started[mode] = SimNode.start(
                kube,
                control_plane.kubeconfig,
                control_plane.root / name,
                name,
                profile="mixed",
                mig_mode=mode,
                extra=("--passthrough", "true"),
            )
        yield started
    finally:
        remove_nodes(started.values(), kube, control_plane.logs)
        for name in created:
            kube.delete("deviceclasses", name)


def one_device(device_class: str, address: str) -> dict[str, Any]:
    selector = f'device.attributes["resource.kubernetes.io"].pciBusID == "{address}"'
    exactly = {"deviceClassName": device_class, "selectors": [{"cel": {"expression": selector}}]}
    return {"devices": {"requests": [{"name": "dev", "exactly": exactly}]}}


ORDERS = {
    "gpu-first": ("gpu.dradriver.dev", "vfio.gpu.dradriver.dev"),
    "vm-first": ("vfio.gpu.dradriver.dev", "gpu.dradriver.dev"),
}


CASES = [(mode, order, address) for mode in MODES for order in ORDERS for address in (A100, L4)]


@pytest.mark.parametrize("case", CASES, ids=[f"{m}-{o}-{'a100' if a == A100 else 'l4'}" for m, o, a in CASES])
def test_a_gpu_and_its_passthrough_device_are_never_allocated_together(
    case: tuple[str, str, str], vfio_nodes: dict[str, SimNode], control_plane: ControlPlane, kube: Kube
) -> None:
    mode, order, address = case
    node = vfio_nodes[mode]
    prefix = f"vfio-{mode}-{order}-{address[5:7]}"
    pods: list[GatedPod] = []
    try:
        for i, device_class in enumerate(ORDERS[order]):
            kube.create(
                "resourceclaimtemplates", claim_template(f"{prefix}-{i}", one_device(device_class, address)), NAMESPACE
            )
        first = GatedPod(kube, f"{prefix}-0", f"{prefix}-0", node=node.name).create()
        pods.append(first)
        code, explained = first.explain(control_plane.kubeconfig)
        assert code == EXIT_FITS, explained
        assert first.release() == "scheduled", first.get().get("status")
        [(_, _, device)] = allocated_devices(first.claim())
        assert device.endswith("-vfio") == (order == "vm-first"), device
        second = GatedPod(kube, f"{prefix}-1", f"{prefix}-1", node=node.name).create()
        pods.append(second)
        code, explained = second.explain(control_plane.kubeconfig)
        assert code == EXIT_DOES_NOT_FIT, explained
        assert second.release() == "unschedulable", second.get().get("status")
        assert not allocated_devices(second.claim())
    finally:
        for pod in pods:
            pod.delete()
        for i in range(2):
            kube.delete("resourceclaimtemplates", f"{prefix}-{i}", NAMESPACE)
