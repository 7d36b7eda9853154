"""The example scenarios in examples/scenarios: each is a claim or template plus the workload that uses it,
documented by its header; each validates for every supported Kubernetes release, and our allocator
allocates each claim on the simulated node its header names, as the scheduler would."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from support.sim_slices import DRIVER, published_slices

from dradriver.allocator.allocator import allocate

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted((ROOT / "examples/scenarios").glob("*.yaml"))
VERSIONS = ("1.34.0", "1.35.0", "1.36.0", "1.37.0")
CLASSES = [
    d for p in sorted((ROOT / "manifests/deviceclasses").glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d
]
# The NIC scenario needs a second driver; this one stands in for dranet and the like.
NIC_DRIVER = "nic.example.com"
NIC_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "nic.example.com"},
    "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{NIC_DRIVER}"'}}]},
}
WORKLOADS = ("Pod", "Deployment")


def nic_slice(node: str) -> dict[str, Any]:
    devices = [
        {"name": f"nic-{i}", "attributes": {"resource.kubernetes.io/pcieRoot": {"string": root}}}
        for i, root in enumerate(("pci0000:80", "pci0000:c0"))
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-nics"},
        "spec": {
            "driver": NIC_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def header(path: Path, field: str) -> str:
    match = re.search(rf"^# {field}: (.+)$", path.read_text(), re.M)
    assert match, f"{path.name} must have a '# {field}: ...' header line"
    return match.group(1).strip()


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]
    return spec if workload["kind"] == "Pod" else spec["template"]["spec"]


def claims_of(path: Path) -> list[dict[str, Any]]:
    """The claims the scheduler would allocate: the file's claims and templates, plus the claim it makes for a
    container's extended-resource limit (KEP-5004)."""
    docs = documents(path)
    claims = [d for d in docs if d["kind"] in ("ResourceClaim", "ResourceClaimTemplate")]
    by_resource = {c["spec"]["extendedResourceName"]: c for c in CLASSES if c["spec"].get("extendedResourceName")}
    for workload in (d for d in docs if d["kind"] in WORKLOADS):
        for container in pod_spec(workload)["containers"]:
            for resource, count in (container.get("resources", {}).get("limits") or {}).items():
                if resource in by_resource:
                    request = {"deviceClassName": by_resource[resource]["metadata"]["name"], "count": int(count)}
                    claims.append(
                        {
                            "apiVersion": "resource.k8s.io/v1",
                            "kind": "ResourceClaim",
                            "metadata": {"name": f"{workload['metadata']['name']}-extended-resources"},
                            "spec": {"devices": {"requests": [{"name": "container-0-request-0", "exactly": request}]}},
                        }
                    )
    return claims


def taint(slices: list[dict[str, Any]], rules: list[dict[str, Any]]) -> None:
    """What the API server does for a DeviceTaintRule: the selected devices carry its taint."""
    for rule in rules:
        selector = rule["spec"]["deviceSelector"]
        for s in slices:
            if selector.get("driver", s["spec"]["driver"]) != s["spec"]["driver"]:
                continue
            for device in s["spec"].get("devices", []):
                if selector.get("device", device["name"]) == device["name"]:
                    device.setdefault("taints", []).append(dict(rule["spec"]["taint"]))


def test_there_are_enough_scenarios() -> None:
    assert len(SCENARIOS) >= 14


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_is_documented_and_self_contained(path: Path) -> None:
    for field in ("Scenario", "Node", "Expect"):
        header(path, field)
    re.compile(header(path, "Expect"))
    docs = documents(path)
    claims = {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"].startswith("ResourceClaim")}
    workloads = [d for d in docs if d["kind"] in WORKLOADS]
    assert workloads, f"{path.name} holds no Pod or Deployment that uses its claim"
    for workload in workloads:
        spec = pod_spec(workload)
        pod_claims = {c["name"]: c for c in spec.get("resourceClaims", [])}
        for reference in pod_claims.values():
            if "resourceClaimTemplateName" in reference:
                assert ("ResourceClaimTemplate", reference["resourceClaimTemplateName"]) in claims
            else:
                assert ("ResourceClaim", reference["resourceClaimName"]) in claims
        for container in spec["containers"]:
            used = container.get("resources", {})
            assert used.get("claims") or used.get("limits"), f"container {container['name']} uses no device"
            for claim in used.get("claims", []):
                assert claim["name"] in pod_claims, f"container {container['name']}: no pod claim {claim['name']}"


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_objects_pass_the_official_schemas(path: Path, version: str) -> None:
    docs = documents(path)
    assert docs, f"{path} holds no object"
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)  # raises on the first invalid one


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_our_allocator_allocates_the_scenario_on_its_node(path: Path) -> None:
    profile, *flags = header(path, "Node").split()
    options = dict(zip(flags[::2], flags[1::2], strict=True))
    node = "sim-node"
    published = published_slices(
        profile, options.get("--mig-mode", "none"), node=node, gpu_sharing=options.get("--gpu-sharing", "exclusive")
    )
    slices = [*published, nic_slice(node)]
    taint(slices, [d for d in documents(path) if d["kind"] == "DeviceTaintRule"])
    claims = claims_of(path)
    assert claims, f"{path.name} holds no claim"
    for claim in claims:
        allocation = allocate(claim, slices=slices, classes=[*CLASSES, NIC_CLASS], node=node)
        results = allocation["devices"]["results"]
        assert results, f"{claim['metadata']['name']}: nothing allocated"
        ours = [r for r in results if r["driver"] == DRIVER]
        assert ours, f"{claim['metadata']['name']}: no GPU allocated"


def test_the_publisher_example_publishes_once_and_names_the_invalid_field() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples/python/publish_one_device.py")],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert done.stdout.startswith("SyncResult(created=1, updated=0, deleted=0")
    assert "SyncResult(created=0, updated=0, deleted=0" in done.stdout  # the second pass writes nothing
    assert "field=spec.devices[0].name rule=device-name-dns-label" in done.stderr
