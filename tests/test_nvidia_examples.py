"""Manifests written for NVIDIA's DRA driver (examples/nvidia) work unedited on the nvidia compatibility preset:
they pass the official schemas, our allocator allocates them on slices published as gpu.nvidia.com with NVIDIA's
DeviceClasses, `dradriver explain --compat nvidia` finds them fitting, and the driver prepares each allocation
(configs included) and unprepares it. The real scheduler allocates them in tests/cluster/test_nvidia_compat.py;
tests/node/test_nvidia_manifests.py runs the files NODE_TEST_MANIFESTS lists in containers on a real kubelet."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from support.sim_slices import published_slices

from dradriver.allocator.allocator import allocate
from dradriver.cli.main import main
from dradriver.driver.prepare.checkpoint import CheckpointStore
from dradriver.driver.prepare.mps import MpsControl
from dradriver.driver.prepare.presets import NVIDIA
from dradriver.driver.prepare.state import GpuDriver, GpuDriverOptions
from dradriver.gpu.inventory import MigMode, discover
from dradriver.nvidia_install.cdi import CdiWriter
from dradriver.plugin.handler import ClaimRef
from dradriver.plugin.kubeletplugin.claims import allocated_claim
from dradriver.sim import mps_standin
from dradriver.sim.fakelib import simulated_gpulib_on
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = sorted((ROOT / "examples/nvidia").glob("*.yaml"))
VERSIONS = ("1.34.0", "1.35.0", "1.36.0", "1.37.0")
NODE = "sim-node"


def node_settings(path: Path) -> tuple[str, str]:
    """The simulated node profile and MIG mode a manifest's ``# Node:`` header names."""
    match = re.search(r"^# Node: (\S+) --mig-mode (\S+)$", path.read_text(), re.M)
    assert match, f"{path.name} needs a '# Node: <profile> --mig-mode <mode>' header"
    return match[1], match[2]


#: What tests/node/test_nvidia_manifests.py runs on a real kubelet and containerd: each manifest with the simulated
#: node it needs (`dradriver run --compat nvidia --sim-profile P --mig-mode M`) and the line its containers print.
NODE_TEST_MANIFESTS: list[tuple[Path, str, str, str]] = [
    (
        path,
        *node_settings(path),
        re.search(r"^# Expect: (.+)$", path.read_text(), re.M)[1],  # type: ignore[index]
    )
    for path in MANIFESTS
]


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def claims_of(path: Path) -> list[dict[str, Any]]:
    """The claims of a manifest as the API server holds them: a template's spec made into a claim."""
    claims = []
    for doc in documents(path):
        if doc["kind"] == "ResourceClaim":
            claims.append(doc)
        elif doc["kind"] == "ResourceClaimTemplate":
            claims.append({**doc, "kind": "ResourceClaim", "spec": doc["spec"]["spec"]})
    return claims


def test_there_is_a_manifest_for_every_kind_the_quickstart_documents() -> None:
    assert len(MANIFESTS) >= 8
    text = "".join(p.read_text() for p in MANIFESTS)
    for wanted in ("TimeSlicing", "strategy: MPS", "mig.nvidia.com", "kind: MigDeviceConfig", "--mig-mode dynamic"):
        assert wanted in text


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=[p.stem for p in MANIFESTS])
def test_the_manifests_pass_the_official_schemas(path: Path, version: str) -> None:
    docs = documents(path)
    assert docs, f"{path} holds no object"
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)  # raises on the first invalid one


@pytest.mark.parametrize("path", MANIFESTS, ids=[p.stem for p in MANIFESTS])
def test_explain_with_the_nvidia_preset_finds_every_manifest_fitting(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile, mig_mode = node_settings(path)
    code = main(["explain", "--compat", "nvidia", "--sim-profile", profile, "--mig-mode", mig_mode, str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "using the DeviceClasses the chart installs with compat=nvidia: gpu.nvidia.com, mig.nvidia.com, and" in out


def test_explain_without_the_preset_knows_no_nvidia_classes(capsys: pytest.CaptureFixture[str]) -> None:
    path = MANIFESTS[0]
    profile, mig_mode = node_settings(path)
    assert main(["explain", "--sim-profile", profile, "--mig-mode", mig_mode, str(path)]) == 2
    assert "DeviceClass gpu.nvidia.com does not exist" in capsys.readouterr().err


def test_explain_with_the_preset_reports_an_nvidia_config_prepare_would_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claim = claims_of(MANIFESTS[0])[0]
    claim["spec"]["devices"]["config"] = [
        {
            "opaque": {
                "driver": "gpu.nvidia.com",
                "parameters": {
                    "apiVersion": "resource.nvidia.com/v1beta1",
                    "kind": "VfioDeviceConfig",
                    "iommu": {"backendPolicy": "IommuFDOnly"},
                },
            }
        }
    ]
    path = tmp_path / "vfio.yaml"
    path.write_text(yaml.safe_dump(claim))
    assert main(["explain", "--compat", "nvidia", "--sim-profile", "mixed", str(path)]) == 2
    assert "iommu.backendPolicy: 'IommuFDOnly' is not allowed" in capsys.readouterr().err


class Driver:
    """The driver as `dradriver run --compat nvidia` wires it, on a simulated node."""

    def __init__(self, tmp_path: Path, profile: str, mig_mode: str) -> None:
        self.sim = SimulatedNode(load_node_profile(profile), node_name=NODE)
        gpulib = simulated_gpulib_on(self.sim)
        self.store = CheckpointStore.open(tmp_path / "state", boot_id="boot-1")
        self.driver = GpuDriver(
            GpuDriverOptions(driver_name=NVIDIA.driver_name, pool=NODE, mig_mode=MigMode(mig_mode)),
            inventory=discover(gpulib),
            cdi=CdiWriter(tmp_path / "cdi"),
            gpulib=gpulib,
            checkpoint=self.store,
            mps=MpsControl(mps_standin.command(), tmp_path / "mps"),
        )


@pytest.fixture
def driver_for(tmp_path: Path) -> Iterator[Any]:
    made: list[Driver] = []

    def make(profile: str, mig_mode: str) -> Driver:
        made.append(Driver(tmp_path, profile, mig_mode))
        return made[-1]

    yield make
    for d in made:
        for record in d.driver.checkpoint.records():
            d.driver.unprepare(ClaimRef(record.namespace, record.name, record.uid))
        d.store.close()


@pytest.mark.parametrize("path", MANIFESTS, ids=[p.stem for p in MANIFESTS])
def test_each_manifest_allocates_and_prepares_on_the_preset(path: Path, driver_for: Any) -> None:
    profile, mig_mode = node_settings(path)
    slices = published_slices(profile, mig_mode, node=NODE, driver=NVIDIA.driver_name)
    driver = driver_for(profile, mig_mode)
    for index, claim in enumerate(claims_of(path)):
        allocation = allocate(claim, slices=slices, classes=NVIDIA.device_classes(), node=NODE)
        assert allocation["devices"]["results"], f"{claim['metadata']['name']}: nothing allocated"
        uid = f"uid-{index}"
        ref = ClaimRef("default", claim["metadata"]["name"], uid)
        typed = allocated_claim({**claim, "status": {"allocation": allocation}}, ref, NVIDIA.driver_name)
        assert typed.devices
        result = driver.driver.prepare_resource_claims([typed])[uid]
        assert result.error is None, result.error
        assert result.devices
        assert driver.driver.unprepare_resource_claims([ref])[uid] is None
