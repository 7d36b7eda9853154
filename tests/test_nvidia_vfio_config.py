"""NVIDIA's passthrough manifest with a ``VfioDeviceConfig`` (kubernetes-sigs/dra-driver-nvidia-gpu
demo/specs/quickstart/v1/gpu-test-vfio-config.yaml, as fetched) on a simulated node run with ``--compat nvidia
--passthrough true``: its claim template passes the official schemas, our allocator gives it a passthrough device
of class vfio.gpu.nvidia.com, and the driver prepares it with its config (legacy IOMMU backend, the API device
``/dev/vfio/vfio``) and unprepares it. The same config on a whole GPU is refused saying what it is for."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from dradriver.allocator.allocator import allocate
from dradriver.driver.prepare.checkpoint import CheckpointStore
from dradriver.driver.prepare.presets import NVIDIA
from dradriver.driver.prepare.state import GpuDriver, GpuDriverOptions, NodeFeatures
from dradriver.driver.prepare.vfio import Passthrough, PassthroughCatalog, PassthroughSteps, nvml_holders, nvml_sees
from dradriver.driver.publish.passthrough import passthrough_slice_specs, share_gpu_counters
from dradriver.driver.publish.slices import SliceSettings, as_resource_slices, build_slice_specs
from dradriver.gpu.inventory import MigMode, discover
from dradriver.nvidia_install.cdi import CdiWriter
from dradriver.nvidia_install.pci_binding import HostPci
from dradriver.plugin.handler import ClaimRef
from dradriver.plugin.kubeletplugin.claims import allocated_claim
from dradriver.sim.fakelib import simulated_gpulib_on
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile
from dradriver.sim.sysfs import gpu_functions, write_tree
from dradriver.validation.slices import SliceShape

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "tests/fixtures/nvidia-passthrough/gpu-test-vfio-config.yaml"
CLASSES = [
    *NVIDIA.device_classes(),
    *(
        d
        for d in yaml.safe_load_all((ROOT / "src/dradriver/cli/data/deviceclasses/passthrough-nvidia.yaml").read_text())
        if d
    ),
]
NODE = "sim-node"


class VfioDriver:
    """`dradriver run --compat nvidia --passthrough true` on a simulated H100 node: its slices and its driver."""

    def __init__(self, tmp_path: Path, *, iommufd: bool = False) -> None:
        sim = SimulatedNode(load_node_profile("hgx-h100-80gb"), node_name=NODE)
        # A kernel with IOMMUFD has /dev/iommu and a cdev per device on vfio-pci (sim/sysfs.py).
        write_tree(
            tmp_path / "host", gpu_functions((g.pci_bus_id, g.product.pci_device_id) for g in sim.gpus), iommufd=iommufd
        )
        kernel = sim.attach_sysfs(tmp_path / "host")
        self.pci = HostPci(tmp_path / "host", kernel)
        gpulib = simulated_gpulib_on(sim)
        inventory = discover(gpulib)
        catalog = PassthroughCatalog(self.pci)
        specs = build_slice_specs(inventory, SliceSettings(driver=NVIDIA.driver_name, mig_mode=MigMode.DYNAMIC))
        vfio = passthrough_slice_specs(catalog.devices(inventory))
        shared = share_gpu_counters(specs, vfio, shape=SliceShape.V1_35)
        self.slices = as_resource_slices(shared, node_name=NODE, driver=NVIDIA.driver_name)
        self.store = CheckpointStore.open(tmp_path / "state", boot_id="boot-1")
        self.cdi_dir = tmp_path / "cdi"
        steps = PassthroughSteps(
            self.pci,
            nvml_sees=nvml_sees(gpulib),
            holders=nvml_holders(gpulib),
            return_timeout_s=5,
            release=gpulib.released,
        )
        self.driver = GpuDriver(
            GpuDriverOptions(
                driver_name=NVIDIA.driver_name,
                pool=NODE,
                mig_mode=MigMode.DYNAMIC,
                features=NodeFeatures(passthrough=Passthrough(catalog, steps)),
            ),
            inventory=inventory,
            cdi=CdiWriter(self.cdi_dir),
            gpulib=gpulib,
            checkpoint=self.store,
        )

    def prepare(self, claim: dict[str, Any], uid: str) -> tuple[ClaimRef, str | None]:
        """Allocate ``claim`` with our allocator and prepare it; its ref and prepare's error (None: prepared)."""
        allocation = allocate(claim, slices=self.slices, classes=CLASSES, node=NODE)
        ref = ClaimRef(claim["metadata"].get("namespace", "default"), claim["metadata"]["name"], uid)
        typed = allocated_claim({**claim, "status": {"allocation": allocation}}, ref, NVIDIA.driver_name)
        return ref, self.driver.prepare_resource_claims([typed])[uid].error


@pytest.fixture
def node(tmp_path: Path) -> Iterator[VfioDriver]:
    made = VfioDriver(tmp_path)
    yield made
    for record in made.driver.checkpoint.records():
        made.driver.unprepare(ClaimRef(record.namespace, record.name, record.uid))
    made.store.close()


def template_claim() -> dict[str, Any]:
    """The manifest's claim template as the API server makes a claim of it."""
    [template] = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d and d["kind"] == "ResourceClaimTemplate"]
    return {**template, "kind": "ResourceClaim", "spec": template["spec"]["spec"]}


@pytest.mark.parametrize("version", ["1.34.0", "1.37.0"])
def test_the_manifest_passes_the_official_schemas(version: str) -> None:
    for doc in yaml.safe_load_all(MANIFEST.read_text()):
        if doc:
            kubernetes_validate.validate(doc, version, strict=True)


def test_nvidias_vfio_config_manifest_prepares_under_compat_nvidia(node: VfioDriver) -> None:
    claim = template_claim()
    assert claim["spec"]["devices"]["config"][0]["opaque"]["parameters"]["kind"] == "VfioDeviceConfig"
    ref, error = node.prepare(claim, "uid-vm")
    assert error is None, error
    [record] = node.driver.checkpoint.records()
    [device] = record.devices
    assert device.name.endswith("-vfio")
    spec = json.loads(next(node.cdi_dir.glob("*.json")).read_text())
    [cdi_device] = spec["devices"]
    nodes = [n["path"] for n in cdi_device["containerEdits"]["deviceNodes"]]
    assert nodes[-1] == "/dev/vfio/vfio" and nodes[0].startswith("/dev/vfio/")  # enableAPIDevice: true
    address = device.name.removesuffix("-vfio").removeprefix("gpu-").replace("-", ":", 2).replace("-", ".")
    assert node.pci.function(address).driver == "vfio-pci"
    assert node.driver.unprepare_resource_claims([ref]) == {"uid-vm": None}
    assert node.pci.function(address).driver == "nvidia"


def test_a_vfio_device_config_on_a_whole_gpu_is_refused_saying_what_it_is_for(node: VfioDriver) -> None:
    claim = template_claim()
    claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "gpu.nvidia.com"
    _, error = node.prepare(claim, "uid-gpu")
    assert error is not None
    # The scheduler writes the manifest's entry (for its one request) without requests: it applies to the claim.
    assert (
        "is a VfioDeviceConfig, which is for passthrough devices only, but device gpu-0000-1b-00-0 is a whole GPU"
        in error
    )
    assert node.driver.checkpoint.records() == []


def cdi_nodes(node: VfioDriver) -> list[str]:
    spec = json.loads(next(node.cdi_dir.glob("*.json")).read_text())
    [cdi_device] = spec["devices"]
    return [n["path"] for n in cdi_device["containerEdits"]["deviceNodes"]]


@pytest.mark.parametrize("iommufd", [False, True])
def test_prefer_iommufd_gives_the_device_cdev_and_dev_iommu_where_the_node_has_iommufd(
    tmp_path: Path, iommufd: bool
) -> None:
    node = VfioDriver(tmp_path, iommufd=iommufd)
    try:
        vfio = [d for s in node.slices for d in s["spec"].get("devices", []) if d["name"].endswith("-vfio")]
        assert {d["attributes"]["iommuFDEnabled"]["bool"] for d in vfio} == {iommufd}
        claim = template_claim()
        claim["spec"]["devices"]["config"][0]["opaque"]["parameters"]["iommu"]["backendPolicy"] = "PreferIommuFD"
        ref, error = node.prepare(claim, "uid-vm")
        assert error is None, error
        # As NVIDIA's driver gives them: the cdev and the IOMMUFD API device, else the legacy pair.
        assert cdi_nodes(node) == (
            ["/dev/vfio/devices/vfio0", "/dev/iommu"] if iommufd else ["/dev/vfio/20", "/dev/vfio/vfio"]
        )
        assert node.driver.unprepare_resource_claims([ref]) == {"uid-vm": None}
        assert not (tmp_path / "host/dev/vfio/devices/vfio0").exists()  # the cdev went with vfio-pci
    finally:
        node.store.close()


def test_legacy_only_keeps_the_group_node_on_a_node_with_iommufd(tmp_path: Path) -> None:
    node = VfioDriver(tmp_path, iommufd=True)
    try:
        ref, error = node.prepare(template_claim(), "uid-vm")  # the manifest's own LegacyOnly
        assert error is None, error
        assert cdi_nodes(node) == ["/dev/vfio/20", "/dev/vfio/vfio"]
        assert node.driver.unprepare_resource_claims([ref]) == {"uid-vm": None}
    finally:
        node.store.close()


def test_a_missing_spec_is_written_again_with_the_nodes_the_claim_got(tmp_path: Path) -> None:
    # PreferIommuFD gave the device's cdev and /dev/iommu: the spec written again (at the kubelet's retry of the
    # prepare, and at start-up) gives the same, not the legacy pair.
    node = VfioDriver(tmp_path, iommufd=True)
    try:
        claim = template_claim()
        claim["spec"]["devices"]["config"][0]["opaque"]["parameters"]["iommu"]["backendPolicy"] = "PreferIommuFD"
        ref, error = node.prepare(claim, "uid-vm")
        assert error is None, error
        assert cdi_nodes(node) == ["/dev/vfio/devices/vfio0", "/dev/iommu"]
        for rewrite in ("retry", "start-up"):
            next(node.cdi_dir.glob("*.json")).unlink()
            if rewrite == "retry":
                assert node.prepare(claim, "uid-vm")[1] is None
            else:
                node.driver.reconcile(lambda _ref: True)
            assert cdi_nodes(node) == ["/dev/vfio/devices/vfio0", "/dev/iommu"], rewrite
        assert node.driver.unprepare_resource_claims([ref]) == {"uid-vm": None}
    finally:
        node.store.close()
