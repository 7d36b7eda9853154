"""examples/passthrough/kubevirt-vm.yaml: its claim template passes the official schemas of every supported
release and our allocator gives it a passthrough GPU on a simulated node run with --passthrough (the chart's
DeviceClass for it, as scripts/gen-manifests renders it); its VirtualMachine names that claim and request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from dradriver.allocator.allocator import allocate
from dradriver.driver.prepare.vfio import PassthroughCatalog
from dradriver.driver.publish.passthrough import passthrough_slice_specs
from dradriver.gpu.inventory import discover
from dradriver.nvidia_install.pci_binding import HostPci
from dradriver.sim.fakelib import simulated_gpulib_on
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples/passthrough/kubevirt-vm.yaml"
CLASSES = ROOT / "src/dradriver/cli/data/deviceclasses/passthrough.yaml"
VERSIONS = ("1.34.0", "1.35.0", "1.36.0", "1.37.0")
NODE = "vm-node"


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def passthrough_slice(tmp_path: Path) -> dict[str, Any]:
    """The slice of passthrough devices `dradriver run --passthrough` publishes for a simulated H100 node."""
    sim = SimulatedNode(load_node_profile("hgx-h100-80gb"), node_name=NODE)
    kernel = sim.attach_sysfs(tmp_path / "host")
    devices = PassthroughCatalog(HostPci(tmp_path / "host", kernel)).devices(discover(simulated_gpulib_on(sim)))
    [spec] = passthrough_slice_specs(devices)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{NODE}-vfio"},
        "spec": {
            "driver": "gpu.dradriver.dev",
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            **spec,
        },
    }


@pytest.mark.parametrize("version", VERSIONS)
def test_the_claim_template_passes_the_official_schemas(version: str) -> None:
    for doc in documents(EXAMPLE):
        if doc["apiVersion"].startswith("resource.k8s.io/"):
            kubernetes_validate.validate(doc, version, strict=True)


def test_the_vm_names_the_template_and_its_request() -> None:
    [template] = [d for d in documents(EXAMPLE) if d["kind"] == "ResourceClaimTemplate"]
    [vm] = [d for d in documents(EXAMPLE) if d["kind"] == "VirtualMachine"]
    spec = vm["spec"]["template"]["spec"]
    [claim] = spec["resourceClaims"]
    assert claim["resourceClaimTemplateName"] == template["metadata"]["name"]
    requests = {r["name"] for r in template["spec"]["spec"]["devices"]["requests"]}
    for gpu in spec["domain"]["devices"]["gpus"]:
        assert gpu["claimName"] == claim["name"] and gpu["requestName"] in requests


def test_our_allocator_gives_the_claim_a_passthrough_gpu(tmp_path: Path) -> None:
    [template] = [d for d in documents(EXAMPLE) if d["kind"] == "ResourceClaimTemplate"]
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "vm"}}
    claim.update(template["spec"])
    allocation = allocate(claim, slices=[passthrough_slice(tmp_path)], classes=documents(CLASSES), node=NODE)
    [result] = allocation["devices"]["results"]
    assert result["device"] == "gpu-0000-1b-00-0-vfio"
