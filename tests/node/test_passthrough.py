"""VFIO passthrough on the real kubelet and containerd (issue #38 item 1, docs/passthrough.md): a pod standing in
for KubeVirt's virt-launcher, with the claim template of examples/passthrough/kubevirt-vm.yaml, gets the GPU's
/dev/vfio group node, the VFIO container node, KubeVirt's PCI_RESOURCE variable and the GPU's PCI address in its
device metadata; while it runs the simulated node's sysfs shows the GPU on vfio-pci, and after the pod is deleted
on nvidia again; and NVIDIA's own passthrough manifest (its class vfio.gpu.nvidia.com) does the same on a node
run with --compat nvidia, and its manifest with a VfioDeviceConfig too.

The node is this module's own (Node vfio-node: `running_node`, its driver run with --passthrough and device
metadata on, its sysfs tree in the module's directory). A simulated node has no /dev/vfio: the CDI spec binds
/dev/null there, as it does for /dev/nvidia*, so the runtime injects the nodes a real node would have."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.cluster_fixtures import running_node
from support.cluster_pods import kubectl, kubectl_apply
from support.control_plane import ControlPlane
from support.node_pods import Workloads, claims_of, documents, on_busybox, unprepared
from support.real_node import RealNode, wait_for

from dradriver.driver.prepare.presets import NVIDIA
from dradriver.gpu.inventory import gpu_name
from dradriver.nvidia_install.pci_binding import HostPci

NODE = "vfio-node"
REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples/passthrough/kubevirt-vm.yaml"
CLASSES = REPO / "src/dradriver/cli/data/deviceclasses/passthrough.yaml"
METADATA_DIR = "/var/run/kubernetes.io/dra-device-attributes"
# What virt-launcher would look at: its VFIO nodes, KubeVirt's variable, the device metadata; then it stays up.
REPORT = (
    "ls /dev/vfio | sed 's/^/vfio: /'; env | grep ^PCI_RESOURCE_; "
    f"find {METADATA_DIR} -name '*-metadata.json' -exec cat {{}} \\; ; echo; echo done; sleep 3600"
)


@pytest.fixture(scope="module")
def vfio_node(
    control_plane: ControlPlane, device_classes: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RealNode, HostPci]]:
    kubectl_apply(kubectl(), control_plane.kubeconfig, CLASSES)
    host = tmp_path_factory.mktemp("vfio") / "host"
    args = ("--passthrough", "true", "--passthrough-host-root", str(host), "--device-metadata", "true")
    with running_node(control_plane, name=NODE, driver_args=args) as node:
        yield node, HostPci(host)


def launcher(name: str) -> list[dict[str, Any]]:
    """The example's claim template (renamed) and a pod that uses it as virt-launcher would."""
    [template] = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d and d["kind"] == "ResourceClaimTemplate"]
    template["metadata"]["name"] = name
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "resourceClaims": [{"name": "passthrough-gpu", "resourceClaimTemplateName": name}],
            "containers": [
                {
                    "name": "compute",
                    "image": "docker.io/library/busybox:1.36",
                    "command": ["sh", "-c", REPORT],
                    "resources": {"claims": [{"name": "passthrough-gpu"}]},
                }
            ],
        },
    }
    return [template, pod]


def printed(node: RealNode, pod: dict[str, Any]) -> list[str]:
    def done() -> list[str] | None:
        fresh = node.kube.get("pods", pod["metadata"]["name"], pod["metadata"]["namespace"])
        lines = [line for lines in node.container_output(fresh).values() for line in lines]
        return lines if "done" in lines else None

    lines: list[str] = wait_for(f"pod {pod['metadata']['name']} to print what it was given", done, 60)
    return lines


def test_a_launcher_pod_gets_the_vfio_group_and_the_gpu_comes_back_after_it(
    vfio_node: tuple[RealNode, HostPci],
) -> None:
    node, host = vfio_node
    workloads = Workloads(node)
    name = f"vm-{uuid.uuid4().hex[:6]}"
    docs = workloads.apply(launcher(name))
    try:
        [pod] = workloads.wait_running(docs[1])
        [claim] = claims_of(node.kube, pod)
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert result["device"].endswith("-vfio")
        [gpu] = [f for f in host.gpus() if result["device"] == gpu_name(f.address) + "-vfio"]
        assert gpu.driver == "vfio-pci"
        lines = printed(node, pod)
        assert f"vfio: {gpu.iommu_group}" in lines and "vfio: vfio" in lines, lines
        assert f"PCI_RESOURCE_GPU_DRADRIVER_DEV_VFIO={gpu.address}" in lines, lines
        start = next(i for i, line in enumerate(lines) if line.startswith("{"))
        metadata = json.loads("".join(lines[start : lines.index("done")]))
        [request] = metadata["requests"]
        [device] = request["devices"]
        assert device["attributes"]["resource.kubernetes.io/pciBusID"] == {"string": gpu.address}
    finally:
        workloads.delete(docs)
    wait_for("the claim to be unprepared", lambda: unprepared(node, claim["metadata"]["uid"]), 60)
    back = host.function(gpu.address)
    assert back.driver == "nvidia" and host.driver_override(gpu.address) is None
    assert not host.vfio_group_node(int(gpu.iommu_group or 0)).exists()


# NVIDIA's own passthrough manifest (kubernetes-sigs/dra-driver-nvidia-gpu demo/specs/quickstart/v1, as fetched):
# class vfio.gpu.nvidia.com, namespace gpu-test-vfio. Only its pod's image and command are replaced when applied
# (the node has busybox and no registry); its claim template is applied as written.
NVIDIA_MANIFEST = REPO / "tests/fixtures/nvidia-passthrough/gpu-test-vfiopci.yaml"
NVIDIA_CLASSES = REPO / "src/dradriver/cli/data/deviceclasses/passthrough-nvidia.yaml"
COMPAT_NODE = "vfio-compat"


@pytest.fixture(scope="module")
def compat_node(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RealNode, HostPci]]:
    kubectl_apply(kubectl(), control_plane.kubeconfig, NVIDIA_CLASSES)
    host = tmp_path_factory.mktemp("vfio-compat") / "host"
    args = ("--compat", "nvidia", "--passthrough", "true", "--passthrough-host-root", str(host))
    with running_node(control_plane, name=COMPAT_NODE, driver_name=NVIDIA.driver_name, driver_args=args) as node:
        yield node, HostPci(host)


def test_nvidias_passthrough_manifest_runs_under_compat_nvidia(compat_node: tuple[RealNode, HostPci]) -> None:
    node, host = compat_node
    docs = documents(NVIDIA_MANIFEST)
    on_busybox(docs, REPORT)
    assert_the_pod_gets_a_gpu_on_vfio_until_deleted(node, host, docs)


def assert_the_pod_gets_a_gpu_on_vfio_until_deleted(node: RealNode, host: HostPci, docs: list[dict[str, Any]]) -> None:
    """Applies `docs` (one Pod and its claim template) on a --compat nvidia node: while the pod runs its GPU is on
    vfio-pci and the GPU's VFIO group node and the VFIO container node are in it; once the pod is deleted and its
    claim unprepared, the GPU is on nvidia again."""
    workloads = Workloads(node)
    applied = workloads.apply(docs)
    [pod_doc] = [d for d in applied if d["kind"] == "Pod"]
    try:
        [pod] = workloads.wait_running(pod_doc)
        [claim] = claims_of(node.kube, pod)
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert result["driver"] == NVIDIA.driver_name and result["device"].endswith("-vfio")
        [gpu] = [f for f in host.gpus() if result["device"] == gpu_name(f.address) + "-vfio"]
        assert gpu.driver == "vfio-pci"
        lines = printed(node, pod)
        assert f"vfio: {gpu.iommu_group}" in lines and "vfio: vfio" in lines, lines
    finally:
        workloads.delete([d for d in applied if d["kind"] != "Namespace"])
    wait_for("the claim to be unprepared", lambda: unprepared(node, claim["metadata"]["uid"]), 60)
    assert host.function(gpu.address).driver == "nvidia"


# NVIDIA's passthrough manifest with a VfioDeviceConfig (iommu: LegacyOnly, enableAPIDevice: true), as fetched. Its
# claim template and namespace are applied as written; its pod names another namespace (gpu-test-vfiopci, which it
# does not create), so it runs here in the template's, with the image and command replaced as above.
NVIDIA_CONFIG_MANIFEST = REPO / "tests/fixtures/nvidia-passthrough/gpu-test-vfio-config.yaml"


def test_nvidias_vfio_config_manifest_runs_under_compat_nvidia(compat_node: tuple[RealNode, HostPci]) -> None:
    node, host = compat_node
    docs = documents(NVIDIA_CONFIG_MANIFEST)
    [template] = [d for d in docs if d["kind"] == "ResourceClaimTemplate"]
    assert template["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["kind"] == "VfioDeviceConfig"
    for doc in docs:
        if doc["kind"] == "Pod":
            doc["metadata"]["namespace"] = template["metadata"]["namespace"]
    on_busybox(docs, REPORT)
    assert_the_pod_gets_a_gpu_on_vfio_until_deleted(node, host, docs)  # the container node: enableAPIDevice: true
