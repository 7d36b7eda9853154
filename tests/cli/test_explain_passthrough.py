"""`dradriver explain --sim-profile … --passthrough true`: the simulated node offers each GPU a second time as a
VFIO passthrough device, as `run --passthrough true` does, so NVIDIA's passthrough examples (under --compat nvidia)
and our KubeVirt VM claim are explained offline; without the flag explain names it (and its chart value) as what
would make them fit. With --fabric-manager-partitions the passthrough devices carry the partition attributes too,
which NVIDIA's Fabric Manager example aligns its two passthrough GPUs on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dradriver.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
NVIDIA_VFIO = sorted((ROOT / "tests/fixtures/nvidia-passthrough").glob("*.yaml"))
NVIDIA_FM = str(ROOT / "tests/fixtures/nvidia-fabric-manager/fm-partition.yaml")
VM_EXAMPLE = str(ROOT / "examples/passthrough/kubevirt-vm.yaml")
HGX = ["--sim-profile", "hgx-h100-80gb", "--mig-mode", "none"]
ASSUMED = "--passthrough true (passthrough.enabled)"
WOULD_FIT = "would fit with: --passthrough true (chart value passthrough.enabled: true)"
PAIRS = [("1b", "43"), ("52", "61"), ("9d", "c3"), ("d1", "df")]  # FM's partitions 3..6 of two GPUs each


def explain_json(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    code = main(["explain", *args, "-o", "json"])
    return code, json.loads(capsys.readouterr().out)


def allocated_devices(claim: dict) -> list[str]:
    return [r["device"] for r in claim["report"]["allocation"]["devices"]["results"]]


@pytest.mark.parametrize("path", NVIDIA_VFIO, ids=[p.stem for p in NVIDIA_VFIO])
def test_nvidia_s_passthrough_examples_fit_with_the_flag(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report = explain_json(str(path), "--compat", "nvidia", *HGX, "--passthrough", "true", capsys=capsys)
    assert code == 0, report
    [claim] = report["claims"]
    [device] = allocated_devices(claim)
    assert device.endswith("-vfio"), device
    assert any(ASSUMED in line for line in report["assumptions"]), report["assumptions"]
    assert any("with passthrough.enabled vfio.gpu.nvidia.com" in line for line in report["assumptions"])


@pytest.mark.parametrize("path", NVIDIA_VFIO, ids=[p.stem for p in NVIDIA_VFIO])
def test_without_the_flag_explain_says_why_and_names_it(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", str(path), "--compat", "nvidia", *HGX]) == 1
    out = capsys.readouterr().out
    assert "does NOT fit on node hgx-h100-80gb" in out
    assert 'among the 8 devices that reached it, gpu.nvidia.com/type is "gpu" (8)' in out
    assert WOULD_FIT in out


def test_our_vm_claim_gets_a_passthrough_gpu_alone_in_its_iommu_group(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = explain_json(VM_EXAMPLE, "--sim-profile", "mixed", "--passthrough", "true", capsys=capsys)
    assert code == 0, report
    [claim] = report["claims"]
    assert allocated_devices(claim) == ["gpu-0000-07-00-0-vfio"]
    assert main(["explain", VM_EXAMPLE, "--sim-profile", "mixed"]) == 1
    assert WOULD_FIT in capsys.readouterr().out


HELD = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: held, namespace: default}
spec:
  devices:
    requests: [{name: gpu, exactly: {deviceClassName: gpu.dradriver.dev}}]
status:
  allocation:
    devices:
      results: [{request: gpu, driver: gpu.dradriver.dev, pool: mixed, device: gpu-0000-87-00-0}]
"""
L4_VM = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: l4-vm, namespace: default}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: vfio.gpu.dradriver.dev
        selectors: [{cel: {expression: 'device.attributes["resource.kubernetes.io"].pciBusID == "0000:87:00.0"'}}]
"""


def test_a_gpu_held_by_a_claim_takes_its_passthrough_device_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The GPU and its passthrough device consume one counter set: with the L4 at 0000:87:00.0 held whole, a claim
    # for its passthrough device does not fit.
    (tmp_path / "held.yaml").write_text(HELD)
    (tmp_path / "l4-vm.yaml").write_text(L4_VM)
    args = [str(tmp_path / "l4-vm.yaml"), "--sim-profile", "mixed", "--passthrough", "true"]
    code, report = explain_json(*args, capsys=capsys)
    assert code == 0, report
    assert allocated_devices(report["claims"][0]) == ["gpu-0000-87-00-0-vfio"]
    assert main(["explain", *args, "--allocated", str(tmp_path / "held.yaml")]) == 1
    assert "0 shared counters available" in capsys.readouterr().out


def test_with_partitions_the_passthrough_devices_carry_them(capsys: pytest.CaptureFixture[str]) -> None:
    # Every passthrough device has its GPU's gpuModuleID and partition<size> attributes, as run publishes them.
    ours = 'device.attributes["gpu.dradriver.dev"]'
    selector = f'{ours}.type == "vfio" && "gpuModuleID" in {ours} && "partition2" in {ours}'
    flags = [*HGX, "--passthrough", "true", "--fabric-manager-partitions", "true"]
    code, report = explain_json("--selector", selector, *flags, capsys=capsys)
    assert code == 0, report
    matched = sorted(d["device"] for d in report["devices"] if d["result"] == "match")
    assert matched == sorted(f"gpu-0000-{bus}-00-0-vfio" for pair in PAIRS for bus in pair)


def test_nvidia_s_fabric_manager_example_gets_the_two_vfio_gpus_of_one_partition(
    capsys: pytest.CaptureFixture[str],
) -> None:
    flags = ["--compat", "nvidia", *HGX, "--passthrough", "true"]
    code, report = explain_json(NVIDIA_FM, *flags, "--fabric-manager-partitions", "true", capsys=capsys)
    assert code == 0, report
    allocated = allocated_devices(report["claims"][0])
    assert any(allocated == [f"gpu-0000-{a}-00-0-vfio", f"gpu-0000-{b}-00-0-vfio"] for a, b in PAIRS), allocated
    # With passthrough alone the pair cannot align on partition2: explain names the other flag.
    assert main(["explain", NVIDIA_FM, *flags]) == 1
    out = capsys.readouterr().out
    assert "matchAttribute gpu.nvidia.com/partition2 over gpus) cannot be met" in out
    assert "would fit with: --fabric-manager-partitions true (chart value fabricManagerPartitions.enabled: true)" in out
