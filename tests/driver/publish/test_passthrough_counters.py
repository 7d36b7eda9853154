"""A GPU and its passthrough device consume one counter set: our allocator never gives both to two claims, gives
either alone, and the pool passes the API server's rules in every MIG mode (a simulated mixed node: a GPU in MIG
mode, MIG-capable A100s, L4s without MIG). Without passthrough devices the slices are what they were."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver.allocator.allocator import allocate, explain_claim
from dradriver.allocator.errors import Unsatisfiable
from dradriver.driver.prepare.vfio import PassthroughCatalog
from dradriver.driver.publish.passthrough import passthrough_slice_specs, share_gpu_counters
from dradriver.driver.publish.slices import SliceSettings, as_resource_slices, build_slice_specs
from dradriver.gpu.inventory import MigMode, discover
from dradriver.nvidia_install.pci_binding import HostPci
from dradriver.sim.fakelib import simulated_gpulib_on
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile
from dradriver.validation.slices import SliceShape, validate_pool

ROOT = Path(__file__).resolve().parents[3]
CLASSES = [
    d
    for name in ("default.yaml", "passthrough.yaml")
    for d in yaml.safe_load_all((ROOT / "src/dradriver/cli/data/deviceclasses" / name).read_text())
    if d
]
NODE = "vm-node"
MIG_GPU, A100, L4 = "0000:07:00.0", "0000:0f:00.0", "0000:87:00.0"


def pool(tmp_path: Path, mode: MigMode, *, passthrough: bool = True) -> list[dict[str, Any]]:
    """The slices `dradriver run --gpu-backend sim --sim-profile mixed --mig-mode <mode> --passthrough` publishes."""
    sim = SimulatedNode(load_node_profile("mixed"), node_name=NODE)
    kernel = sim.attach_sysfs(tmp_path / "host")
    inventory = discover(simulated_gpulib_on(sim))
    specs = build_slice_specs(inventory, SliceSettings(mig_mode=mode))
    vfio = passthrough_slice_specs(PassthroughCatalog(HostPci(tmp_path / "host", kernel)).devices(inventory))
    shared = share_gpu_counters(specs, vfio if passthrough else [], shape=SliceShape.V1_35)
    return as_resource_slices(shared, node_name=NODE)


def claim(name: str, device_class: str, address: str) -> dict[str, Any]:
    selector = f'device.attributes["resource.kubernetes.io"].pciBusID == "{address}"'
    request = {
        "name": "r",
        "exactly": {"deviceClassName": device_class, "selectors": [{"cel": {"expression": selector}}]},
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [request]}},
    }


def allocated(claim_: dict[str, Any], slices: list[dict[str, Any]]) -> dict[str, Any]:
    allocation = allocate(claim_, slices=slices, classes=CLASSES, node=NODE)
    return {**claim_, "status": {"allocation": allocation}}


@pytest.mark.parametrize("mode", list(MigMode))
def test_the_pool_passes_the_api_servers_rules(tmp_path: Path, mode: MigMode) -> None:
    assert validate_pool(pool(tmp_path, mode)) == []


@pytest.mark.parametrize("mode", list(MigMode))
@pytest.mark.parametrize("address", [A100, L4])
def test_a_gpu_and_its_passthrough_device_exclude_each_other(tmp_path: Path, mode: MigMode, address: str) -> None:
    slices = pool(tmp_path, mode)
    gpu = allocated(claim("gpu", "gpu.dradriver.dev", address), slices)
    vfio = allocated(claim("vm", "vfio.gpu.dradriver.dev", address), slices)  # either alone
    assert vfio["status"]["allocation"]["devices"]["results"][0]["device"].endswith("-vfio")
    with pytest.raises(Unsatisfiable):
        allocate(
            claim("vm", "vfio.gpu.dradriver.dev", address), slices=slices, classes=CLASSES, node=NODE, allocated=[gpu]
        )
    with pytest.raises(Unsatisfiable):
        allocate(
            claim("gpu", "gpu.dradriver.dev", address), slices=slices, classes=CLASSES, node=NODE, allocated=[vfio]
        )
    other = claim("vm", "vfio.gpu.dradriver.dev", L4 if address == A100 else A100)
    allocate(other, slices=slices, classes=CLASSES, node=NODE, allocated=[gpu])  # another GPU's stays free


def test_a_mig_device_of_a_gpu_in_mig_mode_excludes_its_passthrough_device(tmp_path: Path) -> None:
    slices = pool(tmp_path, MigMode.STATIC)
    [mig] = [d for s in slices for d in s["spec"].get("devices", ()) if d["name"].startswith("gpu-0000-07-00-0-mig-3g")]
    taken = {
        "metadata": {"name": "mig", "namespace": "default", "uid": "uid-mig"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "r", "driver": "gpu.dradriver.dev", "pool": NODE, "device": mig["name"]}]
                }
            }
        },
    }
    with pytest.raises(Unsatisfiable):
        allocate(
            claim("vm", "vfio.gpu.dradriver.dev", MIG_GPU), slices=slices, classes=CLASSES, node=NODE, allocated=[taken]
        )


@pytest.mark.parametrize("mode", list(MigMode))
def test_without_passthrough_the_slices_are_unchanged(tmp_path: Path, mode: MigMode) -> None:
    sim = SimulatedNode(load_node_profile("mixed"), node_name=NODE)
    specs = build_slice_specs(discover(simulated_gpulib_on(sim)), SliceSettings(mig_mode=mode))
    assert share_gpu_counters(specs, [], shape=SliceShape.V1_35) == specs


def test_explain_says_the_gpus_counters_are_in_use(tmp_path: Path) -> None:
    slices = pool(tmp_path, MigMode.NONE)
    gpu = allocated(claim("gpu", "gpu.dradriver.dev", L4), slices)
    report = explain_claim(
        claim("vm", "vfio.gpu.dradriver.dev", L4), slices=slices, classes=CLASSES, node=NODE, allocated=[gpu]
    )
    assert not report.fits
    [request] = report.requests
    assert request.rejected["gpu.dradriver.dev/vm-node/gpu-0000-87-00-0-vfio"] == (
        "shared counters exhausted by other claims: counter devices of counter set gpu-0000-87-00-0-counters has 0 "
        "left, the device needs 1"
    )
    assert "nor a GPU while its passthrough (-vfio) device is, or the reverse" in request.hints[0]
